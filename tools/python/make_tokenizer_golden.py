#!/usr/bin/env python3
"""Golden tokenizer data for tests/tokenizer_test.cc, made with Hugging Face `tokenizers` (the external reference).

Encodes a varied corpus with `tokenizers` on the real Gemma 3 vocabulary (../shared/tokenizer/gemma3/tokenizer.json)
and on the reconstructed Gemma 4 file (../shared/tokenizer/gemma4/tokenizer.reconstructed.json), and writes
tests/golden/tokenizer_gemma3.json and tests/golden/tokenizer_gemma4.json:

  encode:     [{name, text, ids, decoded, decoded_skip}]  ids = encode(text, add_special_tokens=False).ids,
              decoded = decode(ids), decoded_skip = decode(ids, skip_special_tokens=True)
  decode:     [{name, ids, decoded, decoded_skip}]         hand-made id sequences (byte-fallback runs that are not
              valid UTF-8, ids outside the vocabulary, special tokens between bytes, random ids)
  token_to_id / id_to_token / vocab sizes                   lookups to compare with Tokenizer::token_id/token_piece

and tests/golden/tokenizer_synthetic.json: small hand-made tokenizer.json files (embedded) exercising what the Gemma
files do not use (lstrip/rstrip/single_word, normalized added tokens, Prepend, Split behaviors and invert, unk fusing,
partial byte fallback, ignore_merges, Strip/Replace after Fuse, no decoder), with the same encode/decode lists.

Run with the pinned environment:  .venv/bin/python tools/python/make_tokenizer_golden.py
"""
import argparse
import json
import os
import random
import sys
from pathlib import Path

os.environ["RUST_BACKTRACE"] = "0"  # the synthetic Strip cases make tokenizers panic (caught, dropped)
import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# The real vocabularies are too large for the repository: the shared data folder, ../shared or $QATSERVE_SHARED_DIR.
SHARED = Path(os.environ.get("QATSERVE_SHARED_DIR") or REPO.parent / "shared") / "tokenizer"
TARGETS = {
    "gemma3": SHARED / "gemma3" / "tokenizer.json",
    "gemma4": SHARED / "gemma4" / "tokenizer.reconstructed.json",
}

PYTHON_CODE = '''def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    if n <= 0:
        return []
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])  # next term
    return seq[:n]


class Point:
\tdef __init__(self, x, y):
\t\tself.x, self.y = x, y

if __name__ == "__main__":
    print(fibonacci(10), {"a": 1, 'b': [2, 3]})
'''

CPP_CODE = '''#include <vector>
#include <cstdint>

namespace qs {

template <typename T>
class RingBuffer {
 public:
  explicit RingBuffer(size_t n) : data_(n), head_(0) {}
  void push(const T& v) {
    data_[head_++ % data_.size()] = v;   // overwrite the oldest
  }
  std::vector<T> data_;
  size_t head_;
};

}  // namespace qs

int main(int argc, char** argv) {
    for (int i = 0; i < argc; ++i) { if (argv[i][0] == '-') return 1; }
    return 0x7fffffff & ~0u;
}
'''

PARAGRAPH_EN = (
    "Tokenization is the first step of every language model pipeline, and it is also one of the easiest places "
    "for subtle bugs to hide. A tokenizer maps text to a sequence of integer ids drawn from a fixed vocabulary; "
    "the model never sees characters, only those ids. Byte-pair encoding (BPE) builds the vocabulary by starting "
    "from single characters and repeatedly merging the most frequent adjacent pair, recording each merge with a "
    "rank. At inference time the same merges are replayed in rank order: the lowest-ranked pair present in a word "
    "is merged first, then the next, until no listed pair remains. SentencePiece-style vocabularies replace spaces "
    "with the metaspace character U+2581 so that word boundaries survive as part of the tokens themselves, and "
    "they fall back to raw bytes, written <0x00> through <0xFF>, for any character that is not in the vocabulary. "
    "Decoding reverses all of this: metaspaces become spaces again, consecutive byte tokens are fused and "
    "interpreted as UTF-8, and sequences that are not valid UTF-8 turn into replacement characters. Getting every "
    "one of these details right matters, because a model that was trained on one segmentation of the text will "
    "behave measurably worse when it is fed another, even if both decode to exactly the same string. In 2024, "
    "roughly 3.7 billion people used the internet daily; numbers like 1,234,567.89 and dates like 2025-03-14 "
    "should survive a round trip unchanged, as should quotes (\"double\", 'single'), dashes - -- ---, and "
    "ellipses... at the end of a sentence!"
)

PARAGRAPH_ZH = (
    "分词是每个语言模型流程的第一步，也是最容易隐藏细微错误的地方之一。分词器把文本映射成来自固定词表的整数序列；"
    "模型从来看不到字符，只看到这些编号。字节对编码从单个字符开始，反复合并最常见的相邻字符对，并为每一次合并记录一个"
    "等级。推理时按照等级顺序重放同样的合并：一个词中等级最低的字符对最先合并，然后是下一个，直到没有可合并的字符对为止。"
    "句子片段风格的词表用元空格字符代替空格，使词边界作为词元的一部分保留下来；对于不在词表中的字符，则退回到原始字节。"
    "解码时把这一切反过来：元空格重新变成空格，连续的字节词元被合并并按照统一码转换格式解释，无效的序列变成替换字符。"
    "日本語の文章も混ぜてみましょう：東京は日本の首都で、人口は約一千四百万人です。ひらがな、カタカナ、漢字が混在します。"
    "한국어 문장도 포함합니다: 서울은 대한민국의 수도이며 아름다운 도시입니다. 龘靐齉爩 are rare characters."
)

PARAGRAPH_MULTI = (
    "Résumé of a naïve café owner from Zürich: he spoke Français, Español (¿Qué tal? ¡Muy bien!), Português "
    "(ação, coração), Polski (zażółć gęślą jaźń), Čeština (příliš žluťoučký kůň), Türkçe (İstanbul, ığüşöç), and "
    "Ελληνικά (Καλημέρα κόσμε). Русский: Съешь же ещё этих мягких французских булок, да выпей чаю. Українська: "
    "Гей, хлопці! العربية: مرحبا بالعالم، كيف حالك اليوم؟ هذا نص تجريبي طويل قليلا لاختبار التجزئة. "
    "עברית: שלום עולם, מה שלומך? हिन्दी: नमस्ते दुनिया, आप कैसे हैं? यह एक परीक्षण वाक्य है। "
    "বাংলা: আমি বাংলায় গান গাই। தமிழ்: வணக்கம் உலகம். ไทย: สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ. "
    "Tiếng Việt: Xin chào thế giới, tôi là người Việt Nam. ქართული: გამარჯობა. Հայերեն: Բարեւ աշխարհ. "
    "አማርኛ: ሰላም ለዓለም. Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇯🇵🇩🇪 🧿 🫠 ❤️‍🔥 1️⃣ — math: ∑ᵢ xᵢ² ≤ ∞, ∀ε>0 ∃δ, "
    "√2 ≈ 1.41421356, π ≈ 3.14159, ℝⁿ → ℂ, ⊕ ⊗ ∮ ∂. Currency: $100, €85, £70, ¥11000, ₹8300, ₿0.0025. "
    "Combining: cafe\u0301 vs café, n\u0303, a\u0308\u0301, Z\u0351\u0352a\u0353\u0354l\u0355g\u0356o\u0357."
)

PARAGRAPH_CODE = (
    "```json\n{\n  \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"merges\": [[\"▁\", \"t\"], [\"h\", \"e\"]]},\n"
    "  \"added_tokens\": [{\"id\": 2, \"content\": \"<bos>\", \"special\": true}]\n}\n```\n\n"
    "| column | value |\n|--------|-------|\n| alpha  | 0.001 |\n| beta   | 1e-9  |\n\n"
    "SELECT id, name FROM users WHERE created_at >= '2024-01-01' AND name LIKE '%smith%' ORDER BY id DESC LIMIT 10;\n"
    "$ ./build/tests/unit_tests --gtest_filter='Tokenizer*' 2>&1 | tee log.txt && echo \"exit=$?\"\n"
    "<html><head><title>Test</title></head><body><div class=\"x\"> <p>Hello&nbsp;<b>world</b></p> </div>"
    "<table><tr><td>1</td><td>2</td></tr></table></body></html>\n"
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }\n"
    "    mov rax, [rbp-0x18]\n    xor eax, eax\n    ret\n"
    "https://example.com/path/to/page?query=a%20b&lang=en#section-2 user@example.org 192.168.0.1:8080\n"
    "C:\\Users\\name\\Documents\\file.txt /usr/local/lib/python3.11/site-packages/\n"
)


def base_corpus():
    c = []

    def add(name, text):
        c.append((name, text))

    # ASCII prose and simple strings
    add("empty", "")
    add("single_char", "a")
    add("single_space", " ")
    add("hello", "Hello world")
    add("hello_punct", "Hello, world! How are you today?")
    add("pangram", "The quick brown fox jumps over the lazy dog.")
    add("sentence_caps", "THIS IS ALL CAPS AND This Is Title Case and mIxEd CaSe.")
    add("contractions", "I'm sure they'll say it's fine, isn't it? We've won't can't shan't.")
    add("punctuation", "!@#$%^&*()_+-=[]{}|;':\",./<>?`~ \\ ... ?! -- —")
    # whitespace
    add("leading_spaces", "  leading two spaces")
    add("leading_one_space", " leading space")
    add("trailing_spaces", "trailing spaces   ")
    add("inner_space_runs", "a  b   c    d     e      f")
    add("spaces_only_40", " " * 40)
    add("spaces_only_31", " " * 31)
    add("spaces_only_32", " " * 32)
    add("tab", "\ttab")
    add("tabs_inner", "a\tb\t\tc\t\t\td")
    add("tabs_only_40", "\t" * 40)
    add("tabs_only_31", "\t" * 31)
    add("mixed_ws", "   \t \t  mixed \t whitespace\t ")
    add("space_newline_space", " \n \n ")
    add("crlf", "windows\r\nline\r\nendings\r\n")
    add("cr_only", "old\rmac\rendings")
    # newlines
    add("newline", "\n")
    add("two_newlines", "\n\n")
    add("lines", "line one\nline two\nline three")
    add("para_breaks", "First paragraph.\n\nSecond paragraph.\n\n\nThird paragraph.\n")
    add("newlines_5", "\n" * 5)
    add("newlines_31", "\n" * 31)
    add("newlines_32", "\n" * 32)
    add("newlines_100", "\n" * 100)
    add("newline_space_mix", "a \n b\n\n  c  \n\n\n   d")
    add("leading_trailing_newlines", "\n\n\ntext\n\n\n")
    # code
    add("python", PYTHON_CODE)
    add("cpp", CPP_CODE)
    add("indent_4_8_12", "if x:\n    if y:\n        if z:\n            return 1\n")
    # emoji
    add("emoji_simple", "I love pizza 🍕 and 😀😃😄!")
    add("emoji_skin_tone", "👍🏽 👋🏿 🤝🏻")
    add("emoji_zwj_family", "👨‍👩‍👧‍👦")
    add("emoji_zwj_misc", "🏳️‍🌈 🏴‍☠️ 👩‍💻 🧑‍🚀 ❤️‍🔥")
    add("emoji_flags", "🇺🇸🇯🇵🇫🇷🇩🇪🇧🇷 🏴󠁧󠁢󠁳󠁣󠁴󠁿")
    add("emoji_keycaps", "1️⃣ 2️⃣ #️⃣ *️⃣")
    add("emoji_rare", "🧿🫠🪬🫶🛝🪼")
    # scripts
    add("chinese", "我爱自然语言处理。今天天气很好！")
    add("japanese", "こんにちは、世界。カタカナとひらがなと漢字。")
    add("korean", "안녕하세요 세계, 한국어 토큰화 테스트입니다.")
    add("arabic", "مرحبا بالعالم! هذه جملة عربية للاختبار.")
    add("hebrew", "שלום עולם")
    add("hindi", "नमस्ते दुनिया! यह हिंदी में एक वाक्य है।")
    add("thai", "สวัสดีชาวโลก")
    add("russian", "Привет, мир! Как дела?")
    add("greek", "Γειά σου Κόσμε")
    add("accented_precomposed", "café naïve résumé Zürich São Paulo Ångström")
    add("accented_combining", "cafe\u0301 nai\u0308ve re\u0301sume\u0301 Zu\u0308rich")
    add("stacked_combining", "e\u0301\u0302\u0303\u0304 a\u0300\u0301\u0302")
    add("lone_combining_start", "\u0301abc")
    add("lone_combining_only", "\u0308")
    add("zalgo", "Z\u0351\u0352\u0353a\u0354\u0355l\u0356\u0357g\u0358\u0359o\u035a")
    # digits and numbers
    add("digits", "0123456789")
    add("numbers_in_text", "I have 3 apples, 42 oranges and 1000000 grapes.")
    add("decimal_pi", "3.14159265358979323846264338327950288419716939937510")
    add("long_number", "".join(str((i * 7 + 3) % 10) for i in range(300)))
    add("formatted_numbers", "1,000,000.50 -273.15 +1e-9 0x1F 0b1010 007 2^64=18446744073709551616")
    add("dates_times", "2024-01-01T12:34:56Z 12/31/1999 23:59:59.999")
    add("phone", "+1 (555) 123-4567")
    # special tokens written in text
    add("bos_alone", "<bos>")
    add("bos_text", "<bos>Hello")
    add("eos_pad_mask", "<eos><pad><mask><unk>[multimodal]")
    add("gemma3_turns", "<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n")
    add("gemma3_image", "Look: <start_of_image><image_soft_token><end_of_image> done")
    add("gemma4_turns", "<|turn>user\nHi there!<turn|>\n<|turn>model\n<|channel>thought\n<channel|>Hello!<turn|>\n")
    add("gemma4_tools",
        '<|tool>declaration:get_weather{city:<|"|>Paris<|"|>}<tool|><|tool_call>call:get_weather{city:<|"|>Paris'
        '<|"|>}<tool_call|><|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|><|think|>')
    add("gemma4_media", "<|image><|image|><image|> <|audio><|audio|><audio|> <|video|>")
    add("partial_specials", "<bo <bos <eos <start_of_turn <end_of_tur <|turn <turn| bos> os>")
    add("nested_specials", "<<bos>> <bos<eos>> <<<start_of_turn>>> < bos> <BOS> <Bos>")
    add("unused_tokens", "<unused0><unused1> <unused98> <unused99> <unused6241> <unused6242>")
    add("html_added_tokens", "<table><tr><td>x</td></tr></table> <b>bold</b> <i>it</i> <h1>T</h1> <div> </div>")
    add("specials_with_spaces", " <bos> hello <eos> ")
    add("literal_byte_tokens", "<0x41><0x0A><0xFF> <0x00>")
    # control characters
    add("control_nul", "a\x00b")
    add("control_low", "\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f\x10\x1f")
    add("control_del", "x\x7fy")
    add("ansi_escape", "\x1b[31mred\x1b[0m normal")
    add("zero_width", "zero\u200bwidth\u200cnon\u200djoiner\u2060word")
    add("nbsp", "non\u00a0breaking\u00a0space \u2009thin\u202fnarrow")
    add("bom", "\ufeffBOM at start")
    add("line_separators", "a\u2028b\u2029c\u0085d")
    add("c1_controls", "\x80\x81\x9f")
    # byte fallback and rare code points
    add("private_use", "\ue000\ue001\uf8ff")
    add("nazar", "\U0001f9ff")
    add("supplementary_private", "\U000f0000\U0010fffd")
    add("max_code_point", "\U0010ffff")
    add("tag_chars", "\U000e0001\U000e0041\U000e007f")
    add("cjk_ext_b", "𠀀𠀁𪚥𰻞")
    add("unassigned", "\u0378\u0379\u05ff")
    add("noncharacters", "\ufdd0\ufffe\uffff")
    add("replacement_char", "\ufffd")
    add("byte_fallback_mixed", "a\ue000b\U0001f9ffc \ue000 \U0001f9ff")
    add("emoji_nazar_run", "\U0001f9ff" * 8)
    # metaspace written literally, and the ">▁</" vocabulary entry
    add("metaspace_literal", "▁")
    add("metaspace_run", "▁▁▁ ▁▁")
    add("metaspace_word", "▁hello ▁world a▁b")
    add("gt_space_lt_slash", "<a> </a> x> </y > </ >  </ a>\t</")
    add("gt_metaspace_lt_slash", ">▁</ <p>▁</p>")
    # long words
    add("long_a_5000", "a" * 5000)
    add("long_ab", "ab" * 1000)
    add("long_word_spaced", " ".join(["supercalifragilisticexpialidocious"] * 20))
    add("long_nonspace_cjk", "字" * 600)
    add("long_url", "https://" + "x" * 300 + ".com/" + "/".join(["segment"] * 30))
    # ~2 KB paragraphs
    add("paragraph_en", PARAGRAPH_EN)
    add("paragraph_zh", PARAGRAPH_ZH)
    add("paragraph_multilingual", PARAGRAPH_MULTI)
    add("paragraph_code_markup", PARAGRAPH_CODE)
    return c


FUZZ_PIECES = [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "▁", "a", "the", "The", "ing", " of", "hello", "world", "123",
    "4567", ".", ",", "!", "?", "'", "\"", "<", ">", "/", "</", "> </", "<b>", "</b>", "<bos>", "<eos>", "<bo",
    "s>", "<start_of_turn>", "<|turn>", "<turn|>", "<|\"|>", "[multimodal]", "<mask>", "<0x41>", "é", "e\u0301",
    "\u0301", "ß", "ñ", "中", "文", "日本", "한", "ع", "न", "ि", "😀", "👍🏽", "‍", "🇺", "🇸", "\ue000",
    "\U0001f9ff", "𠀀", "\x00", "\x1b", "\x7f", "\u200b", "\u00a0", "\ufeff", "0", "00", "_", "-", "--", "==",
    "def", "{", "}", "(", ")", ";", "    ", "        ",
]


def fuzz_corpus(seed=20240601, count=80):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = rng.randint(1, 14)
        out.append((f"fuzz_{i:02d}", "".join(rng.choice(FUZZ_PIECES) for _ in range(n))))
    return out


def decode_cases(tok: Tokenizer, seed=777):
    """Hand-made id sequences for decode(): every one is also fed to the C++ StreamDecoder."""
    b = lambda v: tok.token_to_id(f"<0x{v:02X}>")  # noqa: E731
    tid = tok.token_to_id
    size = tok.get_vocab_size(with_added_tokens=True)
    bos, eos = tid("<bos>"), tid("<eos>")
    a, hello = tid("a"), tid("▁hello")
    meta = tid("▁")
    cases = [
        ("empty", []),
        ("euro_bytes", [b(0xE2), b(0x82), b(0xAC)]),
        ("euro_bytes_then_text", [b(0xE2), b(0x82), b(0xAC), a, hello]),
        ("incomplete_run_end", [a, b(0xE2), b(0x82)]),
        ("incomplete_run_then_text", [b(0xE2), b(0x82), a]),
        ("valid_then_invalid_same_run", [b(0xE2), b(0x82), b(0xAC), b(0xFF), a]),
        ("two_chars_one_run", [b(0xF0), b(0x9F), b(0xA7), b(0xBF), b(0xE2), b(0x82), b(0xAC)]),
        ("lone_ff", [b(0xFF)]),
        ("lone_continuation", [b(0x80), a]),
        ("overlong", [b(0xC0), b(0x80)]),
        ("surrogate_bytes", [b(0xED), b(0xA0), b(0x80)]),
        ("above_max", [b(0xF4), b(0x90), b(0x80), b(0x80)]),
        ("ascii_bytes", [b(0x48), b(0x69), b(0x20), b(0x0A)]),
        ("metaspace_bytes", [b(0xE2), b(0x96), b(0x81), meta, a]),
        ("special_between_bytes", [b(0xE2), bos, b(0x82), b(0xAC)]),
        ("special_between_bytes_2", [b(0xF0), b(0x9F), eos, b(0xA7), b(0xBF), a]),
        ("specials_only", [bos, eos, tid("<pad>"), tid("<unk>"), tid("<mask>"), tid("[multimodal]")]),
        ("specials_around_text", [bos, hello, meta, a, eos]),
        ("out_of_range_ids", [a, size, size + 5, 10_000_000, hello]),
        ("all_specials", sorted(_special_ids(tok))),
    ]
    rng = random.Random(seed)
    n_vocab = tok.get_vocab_size(with_added_tokens=False)
    byte_ids = [b(v) for v in range(256)]
    for i in range(24):
        seq = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            if r < 0.45:
                seq.append(rng.choice(byte_ids))
            elif r < 0.5:
                seq.append(rng.randint(0, 300))
            else:
                seq.append(rng.randrange(n_vocab))
        cases.append((f"random_{i:02d}", seq))
    return cases


def _special_ids(tok: Tokenizer):
    return [i for i, t in tok.get_added_tokens_decoder().items() if t.special]


def make(tok_path: Path, out_path: Path):
    tok = Tokenizer.from_file(str(tok_path))
    corpus = base_corpus() + fuzz_corpus()
    names = [n for n, _ in corpus]
    assert len(names) == len(set(names)), "duplicate corpus names"

    encode = []
    for name, text in corpus:
        ids = tok.encode(text, add_special_tokens=False).ids
        encode.append({"name": name, "text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                       "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    decode = []
    for name, ids in decode_cases(tok):
        assert all(i is not None for i in ids), name
        decode.append({"name": name, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                       "decoded_skip": tok.decode(ids, skip_special_tokens=True)})

    lookups = ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>", "<end_of_turn>",
               "<|turn>", "<turn|>", "<|\"|>", "<image_soft_token>", "<|image|>", "▁", "▁▁", "▁hello", "hello",
               "\n", "\n\n", "\t", "<0x00>", "<0x41>", "<0xFF>", "<table>", "<unused0>", "<unused6241>", "a", "",
               " ", "no_such_token_xyz"]
    token_to_id = [[s, tok.token_to_id(s)] for s in lookups]
    probe_ids = [0, 1, 2, 3, 4, 5, 6, 105, 106, 107, 138, 168, 238, 493, 1000, 29104, 236743, 255999, 256000,
                 258880, 262143, 262144, 262145]
    id_to_token = [[i, tok.id_to_token(i)] for i in probe_ids]

    doc = {
        "source": str(tok_path.relative_to(REPO.parent)),
        "generator": "tools/python/make_tokenizer_golden.py",
        "tokenizers_version": tokenizers.__version__,
        "vocab_size_with_added": tok.get_vocab_size(with_added_tokens=True),
        "vocab_size_model": tok.get_vocab_size(with_added_tokens=False),
        "token_to_id": token_to_id,
        "id_to_token": id_to_token,
        "encode": encode,
        "decode": decode,
    }
    # One entry per line: small diffs, still plain JSON.
    parts = ["{"]
    keys = list(doc)
    for k in keys:
        v = doc[k]
        sep = "," if k != keys[-1] else ""
        if isinstance(v, list):
            parts.append(f" {json.dumps(k)}: [")
            parts.append(",\n".join("  " + json.dumps(e, ensure_ascii=True) for e in v))
            parts.append(f" ]{sep}")
        else:
            parts.append(f" {json.dumps(k)}: {json.dumps(v)}{sep}")
    parts.append("}")
    out_path.write_text("\n".join(parts) + "\n", encoding="ascii")
    json.loads(out_path.read_text())  # well-formed
    n_ids = sum(len(e["ids"]) for e in encode)
    print(f"{out_path}: {len(encode)} encode entries ({n_ids} ids), {len(decode)} decode entries, "
          f"{out_path.stat().st_size} bytes")


# ---------------------------------------------------------------------------------------------------------------
# Synthetic tokenizer.json files for the options the Gemma files do not use (lstrip/rstrip/single_word, normalized
# added tokens, Prepend, every Split behavior, invert, unk fusing, partial byte fallback, ignore_merges, Strip and
# Replace after Fuse, no decoder). Each is run through `tokenizers` like the real files.

META = "\u2581"


def _bpe(chars, merges, extra=(), **kw):
    vocab = {}
    for t in list(extra) + list(chars):
        vocab.setdefault(t, len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab, "merges": [list(m) for m in merges]}
    model.update(kw)
    return model


def _added(i, content, special=False, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"id": i, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def _tokenizer(model, added=(), normalizer=None, pre_tokenizer=None, decoder=None):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": list(added),
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None, "decoder": decoder,
            "model": model}


def _split(pattern, behavior, invert=False):
    return {"type": "Split", "pattern": {"String": pattern}, "behavior": behavior, "invert": invert}


def _replace(pattern, content):
    return {"type": "Replace", "pattern": {"String": pattern}, "content": content}


def _strip(content, start, stop):
    return {"type": "Strip", "content": content, "start": start, "stop": stop}


ASCII = "abcdefghijklmnopqrstuvwxyz"


def synthetic_configs():
    return [
        ("metaspace_prepend_strip", _tokenizer(
            _bpe(list("abcxyz" + META), [("a", "b"), (META, "ab"), ("x", "y")], extra=["<unk>", "<0xC3>", "<0xA9>"],
                 fuse_unk=True, byte_fallback=True),
            added=[_added(0, "<unk>", True, False), _added(100, "<s>", True, False, lstrip=True, rstrip=True),
                   _added(101, "xy z", False, True), _added(102, "[W]", single_word=True, normalized=False)],
            normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": META},
                                                            _replace(" ", META)]},
            pre_tokenizer=_split(META, "MergedWithNext"),
            decoder={"type": "Sequence", "decoders": [_replace(META, " "), {"type": "ByteFallback"}, {"type": "Fuse"},
                                                      _strip(" ", 1, 0)]}),
         ["ab ab", "ab??!", "ab  <s>  ab", "xy z", "?\u00e9?", "\u00e9?\u00e9", "[W] a[W] [W]b x[W] [W]_ [W]\u00e9",
          "<s><s>", " <s>", "<s>", "", " ", "   ", "zz yy xy  z", "ab\t<s>\n\nab", "\u00e9\u00e9 \u00e8"]),
        ("split_behaviors_no_decoder", _tokenizer(
            _bpe(list(ASCII + "-,.;:! "), [("a", "b"), ("ab", "c"), ("-", "-"), (".", ".")], extra=["<unk>"]),
            pre_tokenizer={"type": "Sequence", "pretokenizers": [
                _split("-", "Removed"), _split(",", "Isolated"), _split(".", "Contiguous"),
                _split(";", "MergedWithPrevious"), _split(":", "MergedWithNext"), _split("!", "Contiguous", True)]}),
         ["abc-abc--abc", "a,b,,c", "a.b..c...d", "a;b;;c;", ";a", "a:b::c:", ":a:", "x!y!!z", "!a!", "-,.;:!",
          "abc ab a", "UPPER?", "", "---", "...", ";;;", ":::"]),
        ("unk_not_fused_invert_removed", _tokenizer(
            _bpe(list("abc="), [("a", "b")], extra=["<unk>", "abc"], ignore_merges=True),
            pre_tokenizer=_split("=", "Removed", invert=True),
            decoder={"type": "Sequence", "decoders": []}),
         ["abc", "a=b", "==", "x=y=z", "=?=", "abcabc", ""]),
        ("ignore_merges_unk_no_fusion", _tokenizer(
            _bpe(list("abc "), [("a", "b")], extra=["<unk>", "abc"], ignore_merges=True),
            decoder=None),
         ["abc", "abcabc", "ab c", "??", "a??b", "abc?"]),
        ("decoder_after_fuse", _tokenizer(
            _bpe(list("abxQ "), [("a", "b"), ("Q", "Q"), ("x", "a")], extra=["<unk>"]),
            added=[_added(50, "<e>", True, False)],
            decoder={"type": "Sequence", "decoders": [_strip("x", 1, 1), {"type": "Fuse"}, _replace("ab", "X"),
                                                      _strip("Q", 2, 2), {"type": "Fuse"}]}),
         ["ab", "a b", "QQQ ab QQQ", "xaxbx", "xabx", "Q", "QQ", "aab", "abab", "a<e>b", "Qa<e>Q"]),
        ("lstrip_rstrip_normalized_special", _tokenizer(
            _bpe(list("abc" + META), [("a", "b"), (META, "a")], extra=["<unk>"], fuse_unk=True),
            added=[_added(0, "<unk>", True, False), _added(20, "<l>", True, False, lstrip=True),
                   _added(21, "<r>", True, False, rstrip=True), _added(22, " end", True, True),
                   _added(23, "<lr>", False, False, lstrip=True, rstrip=True),
                   _added(24, "<l", False, False), _added(25, "l>", False, False)],
            normalizer=_replace(" ", META),
            decoder={"type": "Sequence", "decoders": [_replace(META, " "), {"type": "Fuse"}]}),
         ["a <l> b", "a<r>  b", "a  <r>  <l>  b", "x end", "end end", " end", "<lr>", "  <lr>  ", "<r>\t\n <l>",
          "a \u3000<l>", "<r>\u00a0\u2003b", "<l><r><lr>", "<l>>", "<<l>", "a <r> <r> b"]),
    ]


def _decode_both(tok, ids):
    """(decode, decode with skip_special_tokens), or None where `tokenizers` panics (its Strip decoder slices out
    of range when a token is shorter than start + stop, or the text is empty and stop > 0)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # the Rust panic message goes to fd 2
    try:
        return tok.decode(ids, skip_special_tokens=False), tok.decode(ids, skip_special_tokens=True)
    except BaseException as e:  # pyo3_runtime.PanicException derives from BaseException
        if type(e).__name__ != "PanicException":
            raise
        return None
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def make_synthetic(out_path: Path):
    cases = []
    dropped = 0
    for name, cfg, texts in synthetic_configs():
        tok = Tokenizer.from_str(json.dumps(cfg))
        encode = []
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            both = _decode_both(tok, ids)
            if both is None:
                dropped += 1
                continue
            encode.append({"text": text, "ids": ids, "decoded": both[0], "decoded_skip": both[1]})
        n = tok.get_vocab_size(with_added_tokens=True)
        rng = random.Random(name)
        decode = []
        for _ in range(16):
            ids = [rng.randrange(n + 2) for _ in range(rng.randint(0, 12))]
            both = _decode_both(tok, ids)
            if both is None:
                dropped += 1
                continue
            decode.append({"ids": ids, "decoded": both[0], "decoded_skip": both[1]})
        cases.append({"name": name, "tokenizer": cfg, "vocab_size_with_added": n,
                      "vocab_size_model": tok.get_vocab_size(with_added_tokens=False),
                      "encode": encode, "decode": decode})
    print(f"synthetic: {dropped} cases dropped where tokenizers panics")
    doc = {"generator": "tools/python/make_tokenizer_golden.py", "tokenizers_version": tokenizers.__version__,
           "cases": cases}
    out_path.write_text("{\n \"generator\": %s,\n \"tokenizers_version\": %s,\n \"cases\": [\n%s\n ]\n}\n" % (
        json.dumps(doc["generator"]), json.dumps(doc["tokenizers_version"]),
        ",\n".join("  " + json.dumps(c, ensure_ascii=True) for c in cases)), encoding="ascii")
    json.loads(out_path.read_text())
    print(f"{out_path}: {len(cases)} synthetic tokenizers, {out_path.stat().st_size} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=REPO / "tests" / "golden")
    args = ap.parse_args()
    if tokenizers.__version__ != "0.23.3":
        print(f"warning: tokenizers {tokenizers.__version__}, the golden files were made with 0.23.3", file=sys.stderr)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, path in TARGETS.items():
        if not path.exists():
            print(f"skipping {name}: {path} not found", file=sys.stderr)
            continue
        make(path, args.out_dir / f"tokenizer_{name}.json")
    make_synthetic(args.out_dir / "tokenizer_synthetic.json")


if __name__ == "__main__":
    main()
