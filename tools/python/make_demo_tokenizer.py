#!/usr/bin/env python3
"""make_demo_tokenizer.py [--out DIR] [--template FILE]: build the small Gemma-4-style tokenizer that ships with the
repository for the synthetic demo model (preset e2b-tiny, vocab_size 4096), and check it with Hugging Face
`tokenizers`.

    .venv/bin/python tools/python/make_demo_tokenizer.py          # writes configs/demo-tokenizer/

The real Gemma tokenizer has 262,144 entries (33 MB of JSON) and cannot be committed or used with a 4096-row
embedding, so this builds one of exactly 4096 ids with the same machinery and the same control-token ids:

  * model: BPE with byte_fallback and fuse_unk, unk `<unk>`; normalizer Replace " " -> "▁" (U+2581); pre-tokenizer
    Split " " MergedWithPrevious (a no-op after the normalizer); decoder Replace "▁" -> " ", ByteFallback, Fuse;
    post-processor prepending `<bos>`. All of it copied in structure from Google's Gemma 3 / 4 tokenizer.json.
  * ids 0..106: Gemma 4's names (the control tokens at their real ids, `<unusedN>` and `[multimodal]` between them,
    as in ../shared/tokenizer/gemma4/tokenizer.reconstructed.json); 107..137 "\n" x 1..31; 138..167 "▁" x 2..31;
    168..237 Gemma's HTML tags (`<table>`, `<b>`, ...); 238..493 the byte tokens `<0x00>`..`<0xFF>` -- every one of
    these at the id it has in the real Gemma vocabulary.
  * 494..: the base characters (▁, printable ASCII, tab, every other character of the corpus below), then the
    pieces of BPE merges learned here from the small embedded corpus (English prose, code, a dozen languages), then
    `<unusedN>` (numbered on from Gemma's `<unused98>`) up to id 4095 if the merges run out.
  * added tokens: the 16 control tokens (special) and the 70 HTML tags (not special), as Gemma's file has them.
    "\n" is an ordinary vocabulary token, reached with merges for runs of newlines and of "▁" as Gemma's are.

The merges are learned by a plain deterministic BPE over "words" (an optional leading "▁" and then a run of letters,
a single digit, or a run of punctuation; much as SentencePiece separates them for Gemma), so no merge ever joins a
letter to punctuation, a digit to anything but a leading "▁", or "\n" to anything but "\n". Pairs seen twice or more
come first; then pairs seen once, inside short words of space-separated scripts, until the ids run out. Ties are
broken by length and the pair's strings, so the output is byte-identical on every run.

Also written: tokenizer_config.json (add_bos_token false: the chat template writes `<bos>`), chat_template.jinja
(Google's Gemma 4 template as published in llama.cpp, copied verbatim from --template, by default the repository's
copy in tests/data/gemma4-tokenizer/, and checked by SHA-256), and README.md with the layout and a
golden list of ids from `tokenizers` that tests/demo_tokenizer_test.cc compares the C++ tokenizer against.
"""
import argparse
import hashlib
import json
import shutil
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "configs" / "demo-tokenizer"
DEFAULT_TEMPLATE = REPO / "tests" / "data" / "gemma4-tokenizer" / "llamacpp-models-templates-gemma4.jinja"
TEMPLATE_SHA256 = "87294f1fa94c3733b7f325252567c990edfd0269ff7df285f995ca5226c8989b"
TEMPLATE_SOURCE = "ggml-org/llama.cpp models/templates/gemma4.jinja @ 75f1ba7389067a9f90082515e124c377a1e104b2"
TOKENIZERS_VERSION = "0.23.3"

VOCAB_SIZE = 4096
SP = "\u2581"  # ▁, SentencePiece's metaspace

# Gemma 4's control tokens at their real ids; all are added tokens marked special.
CONTROL = {
    0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>",
    46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
    51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>",
    105: "<|turn>", 106: "<turn|>",
}
# Gemma's HTML-tag tokens, ids 168..237 in this order (non-special added tokens there too).
HTML_TAGS = (
    "<table> <caption> <thead> <tbody> <tfoot> <tr> <th> <td> </table> </caption> </thead> </tbody> </tfoot> </tr> "
    "</th> </td> <h1> <h2> <h3> <h4> <h5> <h6> <blockquote> </h1> </h2> </h3> </h4> </h5> </h6> </blockquote> "
    "<strong> <em> <b> <i> <u> <s> <sub> <sup> <code> </strong> </em> </b> </i> </u> </s> </sub> </sup> </code> "
    "<a> <html> <body> <img> <span> <bbox> <ul> <li> <div> <iframe> <footer> </a> </html> </body> </img> </span> "
    "</bbox> </ul> </li> </div> </iframe> </footer>"
).split()
FIRST_HTML, FIRST_BYTE, FIRST_FREE = 168, 238, 494
MAX_RUN = 31  # "\n" x 1..31 at 107..137, "▁" x 2..31 at 138..167

# ---------------------------------------------------------------------------------------------------------------
# The training corpus. Short, but written so that the common words of English prose, of chat-style requests and of
# code come out as single tokens, and other scripts at least get their frequent letters and syllables.
# ---------------------------------------------------------------------------------------------------------------
CORPUS_EN = """\
Hello! How are you today? I am fine, thank you. What about you? It is a good day to learn something new.
Hi there, can you help me with a question? Of course. Please tell me what you need, and I will do my best to help.
Thanks a lot for your help. You are welcome. Let me know if you have any other questions.
Could you explain how this works? Sure: first we read the input, then we process it, and finally we write the output.
Good morning, good afternoon, good evening and good night. See you tomorrow. Have a nice weekend!

The quick brown fox jumps over the lazy dog. The dog did not move; it was sleeping in the warm sun near the house.
Once upon a time there was a little girl who lived in a village near the forest. Every morning she walked to the
river to get water for her family. One day she found a small bird with a broken wing, and she carried it home.
Her mother said that they should take care of it until it could fly again. After many weeks the bird was strong,
and the girl opened her hands and watched it fly away over the trees. She was sad, but she was also very happy.

A language model reads text as a sequence of tokens. Each token is a number, and the model has learned which
numbers are likely to follow each other. When you ask a question, the model predicts the answer one token at a
time. The server keeps the key and value cache in memory, so that every new token only needs a small amount of
work. Large models need more memory and more time, which is why people use quantization: the weights are stored
with four bits instead of sixteen, and the model still gives almost the same results. This engine loads the
checkpoint, checks the configuration, and then serves requests over HTTP with an API that looks like the one
from OpenAI. You can send a list of messages, choose the temperature, and stream the response as it is generated.

People often want to know how long something will take, how much it will cost, and whether it will work.
The answer depends on many things: the size of the model, the number of users, the length of the prompt, and the
hardware that is available. In general, a smaller model is faster and cheaper, while a larger model is more
accurate. Before you start, write down what you need, measure what you have, and compare the two. If the numbers
do not match, change the plan. It is better to find a problem early than to find it after the system is running.

Some of the most common words in English are: the, be, to, of, and, a, in, that, have, I, it, for, not, on, with,
he, as, you, do, at, this, but, his, by, from, they, we, say, her, she, or, an, will, my, one, all, would, there,
their, what, so, up, out, if, about, who, get, which, go, me, when, make, can, like, time, no, just, him, know,
take, people, into, year, your, good, some, could, them, see, other, than, then, now, look, only, come, its, over,
think, also, back, after, use, two, how, our, work, first, well, way, even, new, want, because, any, these, give,
day, most, us, is, are, was, were, been, has, had, did, does, said, made, went, got, many, much, more, very, here,
where, why, each, every, both, between, through, during, before, under, again, never, always, often, still, around,
world, life, hand, part, child, eye, woman, man, place, week, case, point, number, group, problem, fact, house,
water, money, story, family, school, country, city, state, company, system, program, question, government, night,
right, small, large, long, great, little, old, big, high, different, important, same, able, last, next, early,
young, few, public, bad, best, better, sure, free, true, real, full, easy, hard, open, close, start, stop, call,
find, tell, ask, seem, feel, try, leave, keep, let, begin, show, hear, play, run, move, live, believe, bring, happen,
write, provide, sit, stand, lose, pay, meet, include, continue, set, learn, change, lead, understand, watch, follow,
create, speak, read, allow, add, spend, grow, offer, remember, love, consider, appear, buy, wait, serve, die, send,
expect, build, stay, fall, cut, reach, kill, remain, suggest, raise, pass, sell, require, report, decide, pull.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday; January, February, March, April, May, June, July,
August, September, October, November, December. One, two, three, four, five, six, seven, eight, nine, ten.
More words: above, across, against, almost, alone, along, already, although, among, another, anything, area,
away, become, behind, below, beside, beyond, body, book, business, car, care, center, certain, chance, class,
clear, cold, color, common, community, computer, control, course, cover, data, dark, death, deep, development,
door, down, each, education, effect, else, end, energy, enough, entire, environment, evening, event, everyone,
everything, example, experience, face, far, father, field, figure, film, fine, fire, food, force, form, friend,
future, game, general, girl, global, goal, ground, guess, happy, head, health, heart, help, history, hope, hour,
human, idea, image, information, interest, issue, job, kind, land, language, late, law, level, light, line, list,
local, love, low, market, matter, maybe, mean, media, member, memory, message, method, middle, mind, minute, model,
moment, month, morning, mother, music, name, nature, need, news, nothing, office, order, others, own, page, paper,
parent, party, past, peace, perhaps, period, person, picture, piece, plan, plant, please, policy, position, power,
present, price, private, process, product, project, quality, quite, reason, record, region, research, result,
road, room, rule, science, second, sense, service, side, simple, since, single, size, social, society, someone,
something, sometimes, soon, sound, space, special, street, strong, student, study, subject, support, table, task,
teacher, team, test, text, thing, thought, together, tonight, toward, tree, type, until, value, various, view,
voice, wall, war, whole, without, word, year, yes, yet, ready, answer, example, section, summary, step, steps.

Here is a short summary of the steps. First, install the dependencies and build the project. Second, download or
create a model checkpoint. Third, start the server and send a request. If something goes wrong, read the error
message carefully: it usually says which file or which value is the problem. For example, "the file does not
exist" means that the path is wrong, and "out of memory" means that the model is too large for this machine.
Let's think step by step. The user asked for a list of three ideas, so the answer should contain exactly three
items, each with a short explanation. I'm not sure that this is correct, but I think it's a reasonable guess.
We don't know yet. They're going to the meeting; you're invited too. It's been a long time since we've talked.
Note that the function returns a new value and does not change its argument. In other words, it has no side
effects. The following example shows how to call it, what it returns, and how to handle errors.
Yes, that is right. No, that is not what I meant. Maybe we should try again later. Why not? Sounds good to me.
What time is it? Where are you going? Who wrote this book? Which one do you prefer, the red one or the blue one?
Thank you very much for your patience. I apologize for the confusion; here is the corrected version.
"""

CORPUS_CODE = '''\
def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    if n <= 0:
        return []
    result = [0, 1]
    while len(result) < n:
        result.append(result[-1] + result[-2])
    return result[:n]


class Request:
    def __init__(self, prompt, max_tokens=128, temperature=1.0):
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.temperature = temperature

    def __repr__(self):
        return f"Request(prompt={self.prompt!r}, max_tokens={self.max_tokens})"


import json
import os
from pathlib import Path

for name in sorted(os.listdir(".")):
    path = Path(name)
    if path.suffix == ".json":
        with open(path, "r", encoding="utf-8") as f:
            data = json.load(f)
        print(name, len(data))

#include <cstdint>
#include <string>
#include <vector>

namespace qs {

struct Config {
  int32_t vocab_size = 4096;
  int32_t hidden_size = 64;
  std::string name;
};

std::vector<float> softmax(const std::vector<float>& logits) {
  float max_value = logits[0];
  for (float x : logits) max_value = std::max(max_value, x);
  std::vector<float> out(logits.size());
  float sum = 0.0f;
  for (size_t i = 0; i < logits.size(); ++i) {
    out[i] = std::exp(logits[i] - max_value);
    sum += out[i];
  }
  for (float& x : out) x /= sum;
  return out;
}

}  // namespace qs

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE\\n", argv[0]);
    return 1;
  }
  return 0;
}

{"model": "gemma-4", "messages": [{"role": "user", "content": "Hello"}], "stream": true, "max_tokens": 256}
{"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant",
 "content": "Hi! How can I help you today?"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 12}}

const response = await fetch("/v1/chat/completions", { method: "POST", body: JSON.stringify(request) });
function add(a, b) { return a + b; }
let value = null; var count = 0; export default function main() { console.log("done"); }
$ cmake -S . -B build -G Ninja && ninja -C build && ./build/tests/unit_tests --gtest_filter='Tokenizer*'
$ git status && git diff --stat && echo "ok" | grep -v error > /dev/null
SELECT id, name, email FROM users WHERE created_at >= '2024-01-01' ORDER BY id DESC LIMIT 10;
# Title

- item one
- item two

**bold** and *italic* and `code` and [a link](https://example.com/index.html).
'''

CORPUS_OTHER = """\
Bonjour, comment allez-vous aujourd'hui ? Je vais très bien, merci. Le chat dort sur la table de la cuisine.
Nous avons besoin de plus de temps pour finir le projet, mais le résultat sera meilleur. C'est la vie, mon ami.
Guten Tag! Wie geht es Ihnen heute? Mir geht es gut, danke. Der Hund schläft im Garten unter dem großen Baum.
Wir müssen die Daten prüfen, bevor wir das Modell trainieren. Grüße aus München und schönes Wochenende!
Hola, ¿cómo estás hoy? Estoy muy bien, gracias. El perro duerme en la casa de mi hermano. ¡Qué día tan bonito!
Necesitamos más información para tomar una decisión. La reunión es mañana por la mañana en la oficina.
Ciao, come stai oggi? Sto bene, grazie. Il gatto dorme sul divano della nonna. Buona giornata a tutti!
Olá, como você está hoje? Estou bem, obrigado. A informação está na página principal do nosso site.
Hallo, hoe gaat het vandaag? Met mij gaat het goed, dank je wel. Dag, tot morgen!
Привет, как дела сегодня? У меня всё хорошо, спасибо. Москва является столицей России. Это очень интересно.
Мы читаем книги, пишем программы и изучаем новые языки каждый день.
你好，今天过得怎么样？我很好，谢谢。我们今天学习中文。北京是中国的首都。这是一个语言模型的测试。
こんにちは、お元気ですか？私は元気です。東京は日本の首都です。今日はいい天気ですね。ありがとうございます。
안녕하세요, 오늘 어떻게 지내세요? 저는 잘 지내요. 서울은 한국의 수도입니다. 감사합니다.
नमस्ते, आप कैसे हैं? मैं ठीक हूँ, धन्यवाद। भारत एक बड़ा देश है।
مرحبا، كيف حالك اليوم؟ أنا بخير، شكرا. هذه جملة باللغة العربية.
Καλημέρα, τι κάνεις σήμερα; Είμαι καλά, ευχαριστώ.
Merhaba, bugün nasılsın? İyiyim, teşekkür ederim. Cześć, jak się masz? Dziękuję, dobrze.
Xin chào, hôm nay bạn thế nào? Tôi khỏe, cảm ơn bạn.
Prices: $19.99, €25, £10, ¥500; temperature 21.5 °C; 50% off; 3 × 4 = 12; 2024-06-30 12:45:00; "quotes" — dashes –
"""

CORPUS = CORPUS_EN + "\n" + CORPUS_CODE + "\n" + CORPUS_OTHER

# Five strings whose ids from `tokenizers` go into README.md for the C++ test (and more for the round-trip check).
GOLDEN = [
    "Hello, how are you today?",
    "def add(a, b):\n    return a + b  # sum\n\n\nprint(add(2, 40))",
    "Grüße aus München! Привет, мир. 東京は晴れです。",
    "I \u2764\ufe0f llamas \U0001f999\U0001f389 (byte fallback: \u00e6\u00f8\u00e5 \u20ac \U00010348)",
    "<bos><|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>4<turn|>\n<b>bold</b>",
]
ROUND_TRIP = GOLDEN + [
    "",
    " ",
    "  leading and trailing spaces  ",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nmany newlines",
    "tabs\tand\t\tmore\ttabs",
    "The quick brown fox jumps over the lazy dog.",
    "Emoji family: \U0001f468\u200d\U0001f469\u200d\U0001f467 flags \U0001f1ef\U0001f1f5",
    "<unused5> [multimodal] <|tool_call>call:f{x:<|\"|>y<|\"|>}<tool_call|>",
    "\u0000\u0001 control chars \u007f",
]


# ---------------------------------------------------------------------------------------------------------------
# Learning the merges
# ---------------------------------------------------------------------------------------------------------------
def char_class(c):
    if c == SP:
        return "space"
    if c in "\n\t\r":
        return "ws"
    cat = unicodedata.category(c)
    if cat[0] in "LM":
        return "letter"
    if cat == "Nd":
        return "digit"
    return "punct"


def words(text, bare=False):
    """The units merges are learned within: [▁] + (letters | one digit | a run of punctuation). With `bare` the ▁
    is a unit of its own, so no merge joins a space to a word: a word then has the same tokens after a space as
    after a quote or a colon (a value copied from a request into a tool call or a JSON string)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text[i] == SP:
            run = i
            while i < n and text[i] == SP:
                i += 1
            if i == n or char_class(text[i]) == "ws":
                continue  # ▁ before a line break or the end stays alone (runs are covered by the fixed merges)
            # One ▁ starts the word; after a run, the run's merges (ranked first) take every ▁, so the word is bare.
            start = i - 1 if i - run == 1 and not bare else i
        else:
            start = i
        cls = char_class(text[i])
        if cls == "ws":
            i += 1
            continue  # newlines and tabs are never merged with anything else
        i += 1
        if cls != "digit":
            while i < n and char_class(text[i]) == cls:
                i += 1
        out.append(text[start:i])
    return out


def spaced_script(word):
    """True for words of scripts that separate words by spaces (no CJK, kana or Hangul)."""
    return all(ord(c) < 0x2E80 or c == SP for c in word)


def learn_merges(word_counts, vocab, budget):
    """Plain BPE: merge the most frequent adjacent pair (ties: the shorter result, then the smaller strings) until
    no pair occurs twice; then, while ids are left, the same with pairs seen once, but only inside words of at most
    16 characters in space-separated scripts, so that every such word of the corpus becomes one token.
    Returns the merges in rank order and the new pieces in order of creation (at most `budget`)."""
    corpus = [(list(w), c) for w, c in sorted(word_counts.items())]
    for w, _ in corpus:
        for ch in w:
            assert ch in vocab, repr(ch)
    merges, pieces = [], []
    for min_count in (2, 1):
        while len(pieces) < budget:
            pairs = Counter()
            for syms, c in corpus:
                if min_count == 1 and (len(syms) < 2 or sum(map(len, syms)) > 16 or not spaced_script("".join(syms))):
                    continue
                for a, b in zip(syms, syms[1:]):
                    pairs[(a, b)] += c
            if not pairs:
                break
            (a, b), count = min(pairs.items(), key=lambda kv: (-kv[1], len(kv[0][0] + kv[0][1]), kv[0]))
            if count < min_count:
                break
            merges.append((a, b))
            if a + b not in vocab:
                vocab.add(a + b)
                pieces.append(a + b)
            for k, (syms, c) in enumerate(corpus):
                if len(syms) < 2:
                    continue
                out, j = [], 0
                while j < len(syms):
                    if j + 1 < len(syms) and syms[j] == a and syms[j + 1] == b:
                        out.append(a + b)
                        j += 2
                    else:
                        out.append(syms[j])
                        j += 1
                corpus[k] = (out, c)
    return merges, pieces


# ---------------------------------------------------------------------------------------------------------------
# Building tokenizer.json
# ---------------------------------------------------------------------------------------------------------------
def fixed_layout():
    """ids 0..493, as in Gemma's vocabulary."""
    names = {}
    for i in range(0, 107):
        names[i] = CONTROL.get(i) or ("[multimodal]" if i == 5 else f"<unused{i - 6}>")
    for k in range(1, MAX_RUN + 1):
        names[106 + k] = "\n" * k
    for k in range(2, MAX_RUN + 1):
        names[136 + k] = SP * k
    for k, tag in enumerate(HTML_TAGS):
        names[FIRST_HTML + k] = tag
    for b in range(256):
        names[FIRST_BYTE + b] = f"<0x{b:02X}>"
    assert sorted(names) == list(range(FIRST_FREE)), "fixed layout has holes"
    return [names[i] for i in range(FIRST_FREE)]


def run_merges(unit):
    """Merges that make runs of `unit` greedily from the left, longest first (as Gemma ranks them)."""
    return [(unit * (k - 1), unit) for k in range(MAX_RUN, 1, -1)]


def build(corpus=CORPUS, learn=learn_merges, bare_words=False):
    """The tokenizer.json spec for `corpus`, its merges learned by `learn(word_counts, vocab, budget)` (returning
    merges in rank order and the new pieces); the trained tiny model passes a `tokenizers` BpeTrainer here.
    `bare_words`: see `words`."""
    normalized = corpus.replace(" ", SP)
    vocab_list = fixed_layout()
    vocab = set(vocab_list)

    char_freq = Counter(c for c in normalized if c not in "\n ")
    base = [SP, "\t"] + [chr(c) for c in range(0x21, 0x7F)]
    base += sorted((c for c in char_freq if c not in base), key=lambda c: (-char_freq[c], c))
    for c in base:
        assert c not in vocab, repr(c)
        vocab.add(c)
    vocab_list += base

    budget = VOCAB_SIZE - len(vocab_list)
    learned, pieces = learn(Counter(words(normalized, bare_words)), vocab, budget)
    vocab_list += pieces
    n_learned = len(pieces)
    unused = 99
    while len(vocab_list) < VOCAB_SIZE:
        vocab_list.append(f"<unused{unused}>")
        unused += 1
    assert len(vocab_list) == VOCAB_SIZE and len(set(vocab_list)) == VOCAB_SIZE

    merges = [m for pair in zip(run_merges("\n"), run_merges(SP)) for m in pair] + learned

    def added(i, special):
        return {"id": i, "content": vocab_list[i], "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": special}

    added_tokens = [added(i, True) for i in sorted(CONTROL)]
    added_tokens += [added(FIRST_HTML + k, False) for k in range(len(HTML_TAGS))]
    added_tokens.sort(key=lambda t: t["id"])

    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SP},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SP}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
            "vocab": {piece: i for i, piece in enumerate(vocab_list)},
            "merges": [list(m) for m in merges],
        },
    }
    layout = {
        "base": (FIRST_FREE, FIRST_FREE + len(base) - 1),
        "learned": (FIRST_FREE + len(base), FIRST_FREE + len(base) + n_learned - 1),
        "unused": (FIRST_FREE + len(base) + n_learned, VOCAB_SIZE - 1),
        "merges": len(merges),
        "learned_merges": len(learned),
    }
    return spec, layout


def dump_tokenizer_json(spec):
    """Compact but diffable: one vocab entry / merge / added token per line."""
    lines = ["{"]
    for key in ("version", "truncation", "padding"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(spec[key])},")
    lines.append('  "added_tokens": [')
    lines.append(",\n".join("    " + json.dumps(t, ensure_ascii=False) for t in spec["added_tokens"]))
    lines.append("  ],")
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(spec[key], ensure_ascii=False)},")
    model = spec["model"]
    lines.append('  "model": {')
    for key, value in model.items():
        if key not in ("vocab", "merges"):
            lines.append(f"    {json.dumps(key)}: {json.dumps(value)},")
    lines.append('    "vocab": {')
    lines.append(",\n".join(f"      {json.dumps(p, ensure_ascii=False)}: {i}" for p, i in model["vocab"].items()))
    lines.append("    },")
    lines.append('    "merges": [')
    lines.append(",\n".join("      " + json.dumps(m, ensure_ascii=False) for m in model["merges"]))
    lines.append("    ]")
    lines.append("  }")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == spec
    return text


def tokenizer_config():
    named = {
        "sot_token": "<|turn>", "eot_token": "<turn|>", "soc_token": "<|channel>", "eoc_token": "<channel|>",
        "think_token": "<|think|>", "escape_token": '<|"|>', "std_token": "<|tool>", "etd_token": "<tool|>",
        "stc_token": "<|tool_call>", "etc_token": "<tool_call|>", "str_token": "<|tool_response>",
        "etr_token": "<tool_response|>",
    }
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "backend": "tokenizers",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        **named,
        "model_specific_special_tokens": named,
        "padding_side": "left",
        "tokenizer_class": "GemmaTokenizer",
    }
    return json.dumps(config, indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# Checks with `tokenizers`
# ---------------------------------------------------------------------------------------------------------------
def check(tok, spec):
    problems = []
    if tok.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        problems.append(f"vocab size {tok.get_vocab_size(with_added_tokens=True)}")
    for i, name in CONTROL.items():
        if tok.token_to_id(name) != i or tok.id_to_token(i) != name:
            problems.append(f"{name}: id {tok.token_to_id(name)}")
        if tok.encode(name, add_special_tokens=False).ids != [i]:
            problems.append(f"{name} does not encode to [{i}]")
    if tok.token_to_id("\n") != 107 or tok.encode("\n", add_special_tokens=False).ids != [107]:
        problems.append('"\\n" is not 107')
    if tok.encode("\n\n\n", add_special_tokens=False).ids != [109]:
        problems.append('"\\n\\n\\n" is not [109]')
    if tok.encode("a    b", add_special_tokens=False).tokens[1] != SP * 4:
        problems.append("a run of 4 spaces is not one token")
    for b in range(256):
        if tok.token_to_id(f"<0x{b:02X}>") != FIRST_BYTE + b:
            problems.append(f"byte {b:02X} misplaced")
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    if special != set(CONTROL.values()):
        problems.append(f"special added tokens {sorted(special)}")
    for text in ROUND_TRIP:
        ids = tok.encode(text, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        if back != text:
            problems.append(f"round trip {text!r} -> {back!r}")
        if tok.token_to_id("<unk>") in ids:
            problems.append(f"<unk> in {text!r}")
    if tok.encode("Hi", add_special_tokens=True).ids[0] != 2:
        problems.append("post-processor does not prepend <bos>")
    for m in spec["model"]["merges"]:  # merges never join "\n" with anything else
        if ("\n" in m[0] + m[1]) and set(m[0] + m[1]) != {"\n"}:
            problems.append(f"merge {m} mixes a newline")
    if problems:
        sys.exit("make_demo_tokenizer: checks failed:\n  " + "\n  ".join(problems))


def readme(layout, goldens, samples, sizes, template_note):
    b0, b1 = layout["base"]
    l0, l1 = layout["learned"]
    u0, u1 = layout["unused"]
    unused = f"{u0}..{u1}: `<unused99>`.. (merges ran out)" if u0 <= u1 else "none beyond Gemma's own slots"
    golden_json = "[\n" + ",\n".join(" " + json.dumps(g, ensure_ascii=False) for g in goldens) + "\n]"
    rows = "\n".join(f"| {json.dumps(s, ensure_ascii=False)} | {n} | {' '.join(p)} |" for s, n, p in samples)
    return f"""# Demo tokenizer (4096 ids, Gemma 4 style)

A small stand-in for Google's Gemma 4 tokenizer, sized for the synthetic demo checkpoint (`--preset e2b-tiny`,
`vocab_size` 4096), so that a fresh clone can run the whole text pipeline without the real 262,144-entry file:

    build/qatserve synth --preset e2b-tiny --out DIR --tokenizer configs/demo-tokenizer

copies every file of this folder into the checkpoint. It is **not** Gemma's vocabulary: only the control tokens,
"\\n", the runs of newlines and spaces, the HTML tags and the byte tokens have Gemma's ids; the rest was learned from
about 12 KB of text embedded in the script, so ids of ordinary words differ from the real tokenizer's, and real
Gemma weights cannot be used with it.

Made by `tools/python/make_demo_tokenizer.py` (deterministic; Hugging Face `tokenizers` {TOKENIZERS_VERSION} checks it):

    .venv/bin/python tools/python/make_demo_tokenizer.py

| file | bytes | what |
| --- | --- | --- |
| `tokenizer.json` | {sizes['tokenizer.json']} | BPE, byte_fallback, normalizer " " -> "▁", decoder "▁" -> " " + ByteFallback + Fuse, as Gemma's |
| `tokenizer_config.json` | {sizes['tokenizer_config.json']} | `GemmaTokenizer`, bos `<bos>`, eos `<eos>`, pad `<pad>`, unk `<unk>`, `add_bos_token: false` |
| `chat_template.jinja` | {sizes['chat_template.jinja']} | Google's Gemma 4 chat template (see below) |

## Vocabulary layout

| ids | tokens |
| --- | --- |
| 0..4 | `<pad>` `<eos>` `<bos>` `<unk>` `<mask>` (special) |
| 5..104 | `[multimodal]`, `<unusedN>` (N = id - 6) except the control tokens below |
| 46..52 | `<\\|tool>` `<tool\\|>` `<\\|tool_call>` `<tool_call\\|>` `<\\|tool_response>` `<tool_response\\|>` `<\\|"\\|>` (special) |
| 98, 100, 101 | `<\\|think\\|>`, `<\\|channel>` `<channel\\|>` (special) |
| 105, 106 | `<\\|turn>` `<turn\\|>` (special) |
| 107..137 | "\\n" x 1..31 (ordinary tokens, built by merges) |
| 138..167 | "▁" x 2..31 (ordinary tokens, built by merges) |
| 168..237 | Gemma's HTML tags `<table>` .. `</footer>` (added tokens, not special) |
| 238..493 | `<0x00>`..`<0xFF>` (byte fallback) |
| {b0}..{b1} | base characters: `▁`, tab, printable ASCII, the other characters of the training text |
| {l0}..{l1} | pieces of the {layout['learned_merges']} learned merges ({layout['merges']} merges in all) |
| unused | {unused} |

Added tokens: the 16 control tokens (special) and the 70 HTML tags (not special), all `normalized: false`. The
post-processor prepends `<bos>` as Gemma's does; `tokenizer_config.json` sets `add_bos_token: false` because the chat
template writes `<bos>` itself. Hugging Face transformers (5.23) keeps the post-processor regardless, so
`tokenizer(text)` starts with `<bos>` while `apply_chat_template(..., tokenize=True)` gives exactly one. The image/audio/video tokens of Gemma 4 (ids >= 255999) have
no place in 4096 ids and are absent.

## Sample encodings (`encode(text, add_special_tokens=False)`)

| text | tokens | pieces |
| --- | --- | --- |
{rows}

## Chat template

`chat_template.jinja` is Google's Gemma 4 chat template as published in {template_note}: the template text is
Google's (distributed with the Gemma 4 checkpoints, which Google released under the Apache License 2.0), the llama.cpp
repository that carries it is MIT-licensed. It is an early revision: `<|think|>` without a newline, and an empty
thought channel `<|channel>thought\\n<channel|>` after the generation prompt when thinking is off.

## Golden ids

`tests/demo_tokenizer_test.cc` reads this block and holds `qs::Tokenizer` to the ids Hugging Face `tokenizers`
{TOKENIZERS_VERSION} gives (`add_special_tokens=False`) and to an exact decode round trip.

<!-- golden:begin -->
```json
{golden_json}
```
<!-- golden:end -->
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--template", type=Path, default=DEFAULT_TEMPLATE)
    args = ap.parse_args()
    if tokenizers.__version__ != TOKENIZERS_VERSION:
        sys.exit(f"make_demo_tokenizer: needs tokenizers {TOKENIZERS_VERSION}, found {tokenizers.__version__}")

    spec, layout = build()
    text = dump_tokenizer_json(spec)
    tok = Tokenizer.from_str(text)
    check(tok, spec)

    if not args.template.exists():
        sys.exit(f"make_demo_tokenizer: no chat template: {args.template} is missing")
    if hashlib.sha256(args.template.read_bytes()).hexdigest() != TEMPLATE_SHA256:
        sys.exit(f"make_demo_tokenizer: {args.template} is not the expected template (SHA-256 differs)")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tokenizer.json").write_text(text, encoding="utf-8")
    (args.out / "tokenizer_config.json").write_text(tokenizer_config(), encoding="utf-8")
    shutil.copyfile(args.template, args.out / "chat_template.jinja")

    goldens = [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids} for s in GOLDEN]
    sample_texts = [GOLDEN[0], "The quick brown fox jumps over the lazy dog.",
                    "Can you explain how quantization works?", "    return result", GOLDEN[2]]
    samples = []
    for s in sample_texts:
        enc = tok.encode(s, add_special_tokens=False)
        samples.append((s, len(enc.ids), ["`" + p.replace("|", "\\|").replace("\n", "\\n") + "`"
                                          for p in enc.tokens]))
    sizes = {name: (args.out / name).stat().st_size for name in ("tokenizer.json", "tokenizer_config.json",
                                                                  "chat_template.jinja")}
    (args.out / "README.md").write_text(readme(layout, goldens, samples, sizes, TEMPLATE_SOURCE), encoding="utf-8")

    print(f"wrote {args.out}: " + ", ".join(f"{k} {v} B" for k, v in sizes.items()))
    print(f"layout: base {layout['base']}, learned {layout['learned']}, unused {layout['unused']}, "
          f"{layout['merges']} merges")
    for s, n, p in samples:
        print(f"  {n:3d} tokens  {s!r}: {' '.join(p)}")


if __name__ == "__main__":
    main()
