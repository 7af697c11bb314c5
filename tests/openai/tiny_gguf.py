"""A tiny random-weight Qwen3 GGUF with Qwen3's real vocabulary and chat
template, written with the standard library alone, so the API suite can serve
a model whose template marks reasoning (`<think>` ... `</think>`) without a
real reasoning model's download. The same shape as the Rust tests' tiny
models (models/tests/support/tiny.rs): two layers, width 64, Q8_0 projections, f32
norms, a tied output; the vocabulary and template come from
`models/cache/vocab/qwen/` (scripts/fetch_vocab.py).

The weights are random, so the model writes noise; tests force its text with
a grammar, or read only what the server does around it."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

VOCAB_DIR = Path("models/cache/vocab/qwen")

# GGUF value types and ggml tensor types used here.
U32, I32, F32V, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_Q8_0 = 0, 8
ALIGN = 32

# The Qwen3-thinking generation prompt: the template opens the think block
# itself, so the reply starts inside it (Qwen3-*-Thinking-2507, DeepSeek-R1).
ASSISTANT_HEADER = "{{- '<|im_start|>assistant\\n' }}"
OPENED_HEADER = "{{- '<|im_start|>assistant\\n<think>\\n' }}"


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(kind: int, v) -> bytes:
    if kind == U32:
        return struct.pack("<I", v)
    if kind == I32:
        return struct.pack("<i", v)
    if kind == F32V:
        return struct.pack("<f", v)
    if kind == BOOL:
        return struct.pack("<?", v)
    if kind == STRING:
        return _str(v)
    raise ValueError(kind)


def _kv(key: str, kind: int, v, elem: int | None = None) -> bytes:
    out = _str(key) + struct.pack("<I", kind)
    if kind == ARRAY:
        out += struct.pack("<IQ", elem, len(v)) + b"".join(_value(elem, x) for x in v)
    else:
        out += _value(kind, v)
    return out


def _vocab(root: Path):
    tok = json.loads((root / VOCAB_DIR / "tokenizer.json").read_text())
    by_id: dict[int, tuple[str, int]] = {i: (t, 1) for t, i in tok["model"]["vocab"].items()}
    for t in tok["added_tokens"]:
        by_id[t["id"]] = (t["content"], 3 if t.get("special") else 4)
    n = max(by_id) + 1
    tokens = [by_id.get(i, (f"[UNUSED_{i}]", 4)) for i in range(n)]
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in tok["model"]["merges"]]
    template = json.loads((root / VOCAB_DIR / "tokenizer_config.json").read_text())["chat_template"]
    return [t for t, _ in tokens], [k for _, k in tokens], merges, template


def _q8_0(rng: random.Random, n: int, scale: float) -> bytes:
    """`n` random Q8_0 weights (blocks of 32: an f16 scale, 32 int8)."""
    assert n % 32 == 0
    d = struct.pack("<e", 0.5 * scale / 127.0)
    raw = rng.randbytes(n)
    return b"".join(d + raw[i:i + 32] for i in range(0, n, 32))


def _f32(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def write_tiny_qwen3(path: Path, root: Path, opened: bool = False, context: int = 512, seed: int = 7) -> Path:
    """Writes the tiny Qwen3 to `path`; `opened`: its template ends the
    generation prompt with `<think>\\n`, as thinking-only templates do."""
    tokens, types, merges, template = _vocab(root)
    if opened:
        at = template.rindex(ASSISTANT_HEADER)
        template = template[:at] + OPENED_HEADER + template[at + len(ASSISTANT_HEADER):]
    rng = random.Random(seed)
    n_layer, d, n_head, n_kv, hd, ff = 2, 64, 4, 2, 32, 128
    vocab = len(tokens)
    # (name, ggml dims innermost first, type, data)
    tensors: list[tuple[str, list[int], int, bytes]] = [
        ("token_embd.weight", [d, vocab], GGML_Q8_0, _q8_0(rng, d * vocab, 1.0)),
        ("output_norm.weight", [d], GGML_F32, _f32([1.0] * d)),
    ]
    near_one = lambda n: _f32([1.0 + rng.uniform(-0.25, 0.25) for _ in range(n)])  # noqa: E731
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", [d], GGML_F32, _f32([1.0] * d)),
            (p + "attn_q.weight", [d, hd * n_head], GGML_Q8_0, _q8_0(rng, d * hd * n_head, 0.5)),
            (p + "attn_k.weight", [d, hd * n_kv], GGML_Q8_0, _q8_0(rng, d * hd * n_kv, 0.5)),
            (p + "attn_v.weight", [d, hd * n_kv], GGML_Q8_0, _q8_0(rng, d * hd * n_kv, 0.5)),
            (p + "attn_output.weight", [hd * n_head, d], GGML_Q8_0, _q8_0(rng, d * hd * n_head, 0.5)),
            (p + "attn_q_norm.weight", [hd], GGML_F32, near_one(hd)),
            (p + "attn_k_norm.weight", [hd], GGML_F32, near_one(hd)),
            (p + "ffn_norm.weight", [d], GGML_F32, _f32([1.0] * d)),
            (p + "ffn_gate.weight", [d, ff], GGML_Q8_0, _q8_0(rng, d * ff, 0.5)),
            (p + "ffn_up.weight", [d, ff], GGML_Q8_0, _q8_0(rng, d * ff, 0.5)),
            (p + "ffn_down.weight", [ff, d], GGML_Q8_0, _q8_0(rng, d * ff, 0.5)),
        ]
    a = "qwen3"
    kvs = [
        _kv("general.architecture", STRING, a),
        _kv("general.name", STRING, "tern-tiny-qwen3"),
        _kv(f"{a}.block_count", U32, n_layer),
        _kv(f"{a}.embedding_length", U32, d),
        _kv(f"{a}.feed_forward_length", U32, ff),
        _kv(f"{a}.attention.head_count", U32, n_head),
        _kv(f"{a}.attention.head_count_kv", U32, n_kv),
        _kv(f"{a}.context_length", U32, context),
        _kv(f"{a}.rope.freq_base", F32V, 1_000_000.0),
        _kv(f"{a}.attention.layer_norm_rms_epsilon", F32V, 1e-6),
        _kv(f"{a}.vocab_size", U32, vocab),
        _kv(f"{a}.attention.key_length", U32, hd),
        _kv(f"{a}.attention.value_length", U32, hd),
        _kv("tokenizer.ggml.model", STRING, "gpt2"),
        _kv("tokenizer.ggml.pre", STRING, "qwen2"),
        _kv("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
        _kv("tokenizer.ggml.token_type", ARRAY, types, I32),
        _kv("tokenizer.ggml.merges", ARRAY, merges, STRING),
        _kv("tokenizer.ggml.bos_token_id", U32, tokens.index("<|endoftext|>")),
        _kv("tokenizer.ggml.eos_token_id", U32, tokens.index("<|im_end|>")),
        _kv("tokenizer.ggml.add_bos_token", BOOL, False),
        _kv("tokenizer.chat_template", STRING, template),
    ]
    infos, offset = [], 0
    for name, dims, kind, data in tensors:
        infos.append(_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", x) for x in dims)
                     + struct.pack("<IQ", kind, offset))
        offset += (len(data) + ALIGN - 1) // ALIGN * ALIGN
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head + b"\0" * (-len(head) % ALIGN))
        for _, _, _, data in tensors:
            f.write(data + b"\0" * (-len(data) % ALIGN))
    return path
