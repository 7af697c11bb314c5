#!/usr/bin/env python3
"""The LoRA SFT step Tern's trainer takes, in transformers + peft on the CPU.

Loads the same Q4_K_M GGUF through transformers' GGUF loader (dequantized to
f32), puts LoRA r=16 (alpha 32, no dropout) on all seven projections
(q, k, v, o, gate, up, down), and trains the four 256-token sequences of
`ids.json` (scripts/peft_compare_data.py: the same ids `tern train` trains)
as one batch per step: loss on the answer tokens only (the prompt's labels
are -100, as Tern's SFT scores only the response), AdamW at lr 2e-4, grad
norm clipped at 1.0, as Tern's defaults. Each step is timed from the forward
to the end of the optimizer step; tokens/s counts the 4 x 256 tokens fed.
Peak RSS is the process's high-water mark (`ru_maxrss`), read after loading
and after each step. Prints one JSON line per step and a summary line.

Usage: python scripts/peft_compare.py GGUF IDS_JSON [--steps N] [--threads N]
(needs `python3 -m pip install torch transformers peft gguf accelerate`).
"""

import argparse
import json
import os
import platform
import resource
import time


def max_rss_bytes():
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("ids")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    import peft
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(args.gguf)),
        gguf_file=os.path.basename(args.gguf),
        dtype=torch.float32,
    )
    load_s = time.time() - t0
    load_rss = max_rss_bytes()
    cfg = LoraConfig(
        r=args.rank,
        lora_alpha=2 * args.rank,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, cfg)
    model.train()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4, weight_decay=0.0)

    data = json.load(open(args.ids))
    input_ids = torch.tensor([d["ids"] for d in data], dtype=torch.long)
    labels = input_ids.clone()
    for i, d in enumerate(data):
        labels[i, : d["prompt"]] = -100
    tokens = input_ids.numel()
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "peft": peft.__version__,
                "python": platform.python_version(),
                "threads": torch.get_num_threads(),
                "trainable_params": trainable,
                "load_seconds": round(load_s, 2),
                "rss_after_load_bytes": load_rss,
                "batch": list(input_ids.shape),
            }
        ),
        flush=True,
    )
    steps = []
    for step in range(1, args.steps + 1):
        t = time.time()
        out = model(input_ids=input_ids, labels=labels)
        out.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        secs = time.time() - t
        line = {
            "step": step,
            "loss": out.loss.item(),
            "grad_norm": float(norm),
            "tokens": tokens,
            "seconds": round(secs, 3),
            "tokens_per_s": round(tokens / secs, 2),
            "peak_rss_bytes": max_rss_bytes(),
            "load1": os.getloadavg()[0],
        }
        steps.append(line)
        print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {
                "summary": "transformers+peft",
                "tokens_per_s": [s["tokens_per_s"] for s in steps],
                "peak_rss_bytes": max_rss_bytes(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
