#!/usr/bin/env python3
"""train_tiny_qat.py: train, with quantization-aware training on the group-32 int4 grid, a tiny model of the exact
Gemma 4 architecture on Jane Austen's novels, and export it as Google ships QAT models (a `-qat-q4_0-unquantized`
style bf16 directory on which `qatserve repack` finds every group on the grid).

    .venv/bin/python tools/python/train_tiny_qat.py prepare --work out/train     # data + tokenizer (~1 min)
    nice -n 5 .venv/bin/python tools/python/train_tiny_qat.py train --work out/train --minutes 48
    .venv/bin/python tools/python/train_tiny_qat.py export --work out/train --out DIR

This made the first demo model (48 minutes). The current one, models/gemma4-tiny-qat, continues from this script's
data, model and export with agent work: tools/python/train_tiny_agent.py (its docstring has the recipe).

Data: Debian's `r-cran-janeaustenr` (the six novels as Project Gutenberg published them: public domain; the R
package is MIT-licensed). `prepare` fetches the .deb with `apt-get download` (no R needed) and reads the character
vectors out of its R lazy-load database (`data/Rdata.rdb`), then reflows lines into paragraphs. The last 4% of each
novel's paragraphs are held out for perplexity. Chat: synthetic single- and two-turn exchanges rendered with the
Gemma 4 chat template (greetings, "who wrote ...", "tell me about <character>" and "write a sentence about <word>"
answered with a sentence of the training text, "continue: <half a sentence>" answered with its other half), mixed
into the stream so that the model learns `<|turn>model ... <turn|>` and stops.

Tokenizer: `make_demo_tokenizer.build()` (Gemma 4's control tokens, byte fallback, run tokens and chat template at
their real ids) with its merges learned by the `tokenizers` library's BpeTrainer on this corpus.

Model: transformers' Gemma4ForConditionalGeneration (text only): per-layer embeddings, KV sharing of both layer
kinds, sliding + full attention (proportional RoPE on full layers), double-wide MLP on shared layers, final logit
soft-capping, tied embeddings.

QAT: after a float warm-up, every Linear weight whose input dim is a multiple of 32, and the tied embedding (the LM
head) along its hidden dim, is fake-quantized in the forward pass with a straight-through estimator: per group of
32 input columns, step = the bf16 value with at most 5 significant bits nearest amax/8, level = clamp(round(w /
step), -8, 7), w_q = level x step. With a 5-bit step every product level x step (|level| <= 8, 4 bits) is exact in
bf16, so the export writes every such tensor exactly on the grid that `qatserve repack` recovers losslessly.
"""
import argparse
import gzip
import os
import json
import math
import random
import re
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

# On a shared, oversubscribed machine OpenMP's spinning barriers make torch 10-20x slower (measured: 30 vs 500
# tokens/s); passive waiting keeps the two threads useful.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_demo_tokenizer as mdt  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEB = "r-cran-janeaustenr"
DEB_DATA = "usr/lib/R/site-library/janeaustenr/data/"
GROUP = 32
STEP_BITS = 5          # significant bits of a QAT step: level (<= 8) x step is then exact in bf16
HELD_OUT_FRACTION = 0.04
S, FULL = "sliding_attention", "full_attention"

# The model: 2.9 M parameters (1.3 M of them embeddings), sized for about an hour on a shared 2-core machine
# (~500 tokens/s measured there under load); sliding window 64 < context 256 so both layer kinds matter.
TEXT_CONFIG = dict(
    vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=1, head_dim=32, global_head_dim=64, layer_types=[S, S, FULL, S, S, FULL],
    num_kv_shared_layers=2, hidden_size_per_layer_input=32, vocab_size_per_layer_input=4096,
    use_double_wide_mlp=True, sliding_window=64, final_logit_softcapping=30.0, max_position_embeddings=4096,
    rope_parameters={FULL: dict(partial_rotary_factor=0.25, rope_theta=1000000.0, rope_type="proportional"),
                     S: dict(rope_theta=10000.0, rope_type="default")},
    hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
    pad_token_id=0, bos_token_id=2, eos_token_id=1)
TOP_EOS = [1, 106]
CONTEXT = 256
BATCH = 8


# --------------------------------------------------------------------------------------------------- data
def rdata_unserialize(blob):
    """R's XDR serialization (versions 2/3), only what character vectors and their index need."""
    pos, refs = 2, []
    assert blob[:2] == b"X\n", "not an XDR R serialization"

    def i32():
        nonlocal pos
        pos += 4
        return struct.unpack(">i", blob[pos - 4:pos])[0]

    def item():
        nonlocal pos
        flags = i32()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind in (254, 253, 252, 251, 250, 242, 241):  # NULL, environments, markers
            return None
        if kind == 255:                                    # reference to an earlier symbol
            return refs[(flags >> 8 or i32()) - 1]
        if kind == 1:                                      # symbol
            sym = ("symbol", item())
            refs.append(sym)
            return sym
        if kind == 2:                                      # pairlist: [attr] [tag] car cdr
            if has_attr:
                item()
            tag = item() if has_tag else None
            car, cdr = item(), item()
            return [(tag, car)] + (cdr or [])
        if kind == 9:                                      # CHARSXP
            n = i32()
            if n < 0:
                return None
            pos += n
            return blob[pos - n:pos].decode("utf-8")
        n = i32()
        if kind in (16, 19):                               # character vector, list
            value = [item() for _ in range(n)]
        elif kind in (10, 13):                             # logical, integer
            value = list(struct.unpack(f">{n}i", blob[pos:pos + 4 * n]))
            pos += 4 * n
        elif kind == 14:                                   # double
            value = list(struct.unpack(f">{n}d", blob[pos:pos + 8 * n]))
            pos += 8 * n
        else:
            raise ValueError(f"R type {kind} at byte {pos} not supported")
        if has_attr:
            value = (value, item())
        return value

    version = i32()
    i32(), i32()
    if version == 3:
        encoding_length = i32()  # (not `pos += i32()`: that reads pos before i32() moves it)
        pos += encoding_length
    return item()


def austen_novels(work):
    """{title: [lines]} from Debian's r-cran-janeaustenr, fetched with apt-get download into work/deb/."""
    deb_dir = work / "deb"
    deb_dir.mkdir(parents=True, exist_ok=True)
    if not list(deb_dir.glob(f"{DEB}_*.deb")):
        subprocess.run(["apt-get", "download", DEB], cwd=deb_dir, check=True)
    deb = sorted(deb_dir.glob(f"{DEB}_*.deb"))[-1]
    root = deb_dir / "x"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    data = root / DEB_DATA
    index, attrs = rdata_unserialize(gzip.decompress((data / "Rdata.rdx").read_bytes()))
    names = dict(attrs)[("symbol", "names")]
    offsets = dict(zip(names, index))["variables"]
    offsets, var_attrs = offsets if isinstance(offsets, tuple) else (offsets, None)
    var_names = dict(var_attrs)[("symbol", "names")]
    rdb = (data / "Rdata.rdb").read_bytes()
    novels = {}
    for name, (off, length) in zip(var_names, offsets):
        chunk = rdb[off:off + length]
        novels[name] = rdata_unserialize(zlib.decompress(chunk[4:]))
    return deb.name, novels


def paragraphs(lines):
    """Gutenberg's hard-wrapped lines -> paragraphs (italics underscores dropped, spaces collapsed)."""
    out, cur = [], []
    for line in lines + [""]:
        line = (line or "").strip()
        if line:
            cur.append(line)
        elif cur:
            text = re.sub(r"\s+", " ", " ".join(cur).replace("_", "")).strip()
            out.append(text)
            cur = []
    return out


def sentences_of(paras):
    out = []
    for p in paras:
        for s in re.split(r'(?<=[.!?])(?<!Mr\.)(?<!Mrs\.)(?<!Dr\.)(?<!St\.)\s+(?=[A-Z"])', p):
            if 6 <= len(s.split()) <= 28 and s[0].isupper() and s[-1] in '.!?"':
                out.append(s)
    return out


TITLES = {"emma": "Emma", "mansfieldpark": "Mansfield Park", "northangerabbey": "Northanger Abbey",
          "persuasion": "Persuasion", "prideprejudice": "Pride and Prejudice",
          "sensesensibility": "Sense and Sensibility"}
CHARACTERS = ["Elizabeth", "Darcy", "Jane", "Bingley", "Emma", "Harriet", "Mr. Knightley", "Anne", "Captain Wentworth",
              "Elinor", "Marianne", "Catherine", "Fanny", "Edmund", "Mrs. Bennet", "Mr. Collins", "Lydia",
              "Wickham", "Mr. Woodhouse", "Frank Churchill", "Lady Russell", "Willoughby", "Henry Tilney"]
WORDS = ["love", "money", "marriage", "house", "letter", "walk", "dance", "friend", "sister", "mother", "father",
         "weather", "garden", "carriage", "dinner", "family", "heart", "happiness", "morning", "evening", "book",
         "music", "time", "room", "ball", "visit", "party", "pride", "fortune", "home"]
GREETINGS = [("Hello", "Hello! How can I help you today?"), ("Hi", "Hi! What would you like to talk about?"),
             ("Hello!", "Hello! It is a pleasure to meet you."), ("Good morning", "Good morning! How are you?"),
             ("How are you?", "I am very well, thank you. How are you?"),
             ("Thank you", "You are very welcome."), ("Who are you?", "I am a small language model. I have read "
                                                                      "the novels of Jane Austen."),
             ("What can you do?", "I can talk about the novels of Jane Austen and write sentences in her style."),
             ("Goodbye", "Goodbye! I hope to see you again soon.")]


def chat_examples(rng, sents_by_book, n):
    """n synthetic exchanges as (user, answer) lists (one or two turns)."""
    all_sents = [s for ss in sents_by_book.values() for s in ss]
    by_name = {name: [s for s in all_sents if name in s] or all_sents for name in CHARACTERS}
    by_word = {w: [s for s in all_sents if re.search(rf"\b{w}\b", s)] or all_sents for w in WORDS}

    def one():
        kind = rng.random()
        if kind < 0.15:
            return rng.choice(GREETINGS)
        if kind < 0.25:
            key = rng.choice(list(TITLES))
            q = rng.choice(["Who wrote {}?", "Who is the author of {}?", "Who wrote the novel {}?"])
            return q.format(TITLES[key]), f"{TITLES[key]} was written by Jane Austen."
        if kind < 0.5:
            name = rng.choice(CHARACTERS)
            q = rng.choice(["Tell me about {}.", "What do you know about {}?", "Write a sentence about {}."])
            return q.format(name), rng.choice(by_name[name])
        if kind < 0.75:
            word = rng.choice(WORDS)
            q = rng.choice(["Write a sentence about {}.", "Say something about {}.", "Tell me about {}."])
            return q.format(word), rng.choice(by_word[word])
        s = rng.choice(all_sents).split()
        cut = rng.randint(3, len(s) - 3)
        q = rng.choice(["Continue: {}", "Finish this sentence: {}", "Complete the sentence: {}"])
        return q.format(" ".join(s[:cut])), " ".join(s[cut:])

    return [[one() for _ in range(1 if rng.random() < 0.7 else 2)] for _ in range(n)]


def render_chat(turns, template):
    """The chat template's text for the prompt, then the last answer and `<turn|>` (what the model must write)."""
    msgs = []
    for user, answer in turns:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    prompt = template.render(messages=msgs[:-1], add_generation_prompt=True, bos_token="<bos>")
    return prompt + turns[-1][1] + "<turn|>\n"


def tokenizers_learner(word_counts, vocab, budget):
    """`make_demo_tokenizer.build`'s learner, with Hugging Face tokenizers' BpeTrainer instead of the plain one."""
    base = sorted(vocab)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()   # the units contain no space: one unit per "word"
    trainer = trainers.BpeTrainer(vocab_size=len(base) + budget, initial_alphabet=[c for c in base if len(c) == 1],
                                  show_progress=False, min_frequency=2)
    words = list(word_counts.items())
    bpe.train_from_iterator((" ".join([w] * min(c, 50)) for w, c in words), trainer=trainer)
    spec = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["merges"]]
    pieces = [p for p, _ in sorted(spec["vocab"].items(), key=lambda kv: kv[1]) if p not in vocab][:budget]
    kept = set(pieces) | vocab
    merges = [m for m in merges if m[0] + m[1] in kept and m[0] in kept and m[1] in kept]
    return merges, pieces


def prepare(args):
    import jinja2
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    deb_name, novels = austen_novels(work)
    rng = random.Random(20261201)
    train_paras, held_paras, sents_by_book = [], [], {}
    for key in sorted(novels):
        paras = paragraphs(novels[key])
        cut = int(len(paras) * (1 - HELD_OUT_FRACTION))
        train_paras += paras[:cut]
        held_paras += paras[cut:]
        sents_by_book[key] = sentences_of(paras[:cut])
    template = jinja2.Environment().from_string(mdt.DEFAULT_TEMPLATE.read_text())
    chats = [render_chat(t, template) for t in chat_examples(rng, sents_by_book, args.chats)]
    train_text = "\n".join(train_paras) + "\n"
    (work / "train.txt").write_text(train_text)
    (work / "held_out.txt").write_text("\n".join(held_paras) + "\n")
    (work / "chats.txt").write_text("".join(chats))

    # Tokenizer: the demo tokenizer's layout, merges from BpeTrainer on prose + chat text.
    spec, layout = mdt.build(corpus=train_text + "".join(chats[:2000]), learn=tokenizers_learner,
                             bare_words=args.bare_words)
    text = mdt.dump_tokenizer_json(spec)
    tok = Tokenizer.from_str(text)
    mdt.check(tok, spec)
    tdir = work / "tokenizer"
    tdir.mkdir(exist_ok=True)
    (tdir / "tokenizer.json").write_text(text, encoding="utf-8")
    (tdir / "tokenizer_config.json").write_text(mdt.tokenizer_config(), encoding="utf-8")
    (tdir / "chat_template.jinja").write_bytes(mdt.DEFAULT_TEMPLATE.read_bytes())

    # Token streams: the prose as one running text (windows get a <bos>), each chat exchange a document.
    prose = tok.encode(train_text, add_special_tokens=False).ids
    chat_ids = [tok.encode(c, add_special_tokens=False).ids for c in chats]
    torch.save({"prose": torch.tensor(prose, dtype=torch.int16),
                "chats": [torch.tensor(c, dtype=torch.int16) for c in chat_ids]}, work / "tokens.pt")
    held = tok.encode((work / "held_out.txt").read_text(), add_special_tokens=False).ids
    info = dict(deb=deb_name, train_paragraphs=len(train_paras), held_out_paragraphs=len(held_paras),
                train_chars=len(train_text), prose_tokens=len(prose), chat_examples=len(chats),
                chat_tokens=sum(map(len, chat_ids)), held_out_tokens=len(held), tokenizer_layout=layout)
    (work / "prepare.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


# --------------------------------------------------------------------------------------------------- QAT
def qat_step(w):
    """Per group of 32 input columns: the 5-significant-bit value nearest amax/8 (0 for an all-zero group)."""
    groups = w.reshape(*w.shape[:-1], -1, GROUP)
    amax = groups.abs().amax(-1, keepdim=True)
    raw = amax / 8
    exp = torch.floor(torch.log2(raw.clamp_min(1e-30)))
    quantum = torch.exp2(exp - (STEP_BITS - 1))
    step = torch.round(raw / quantum) * quantum
    return torch.where(amax > 0, step, torch.zeros_like(step)), groups


def qat_levels(w):
    step, groups = qat_step(w)
    safe = torch.where(step > 0, step, torch.ones_like(step))
    levels = torch.clamp(torch.round(groups / safe), -8, 7)
    return levels, step


def fake_quant(w):
    """Straight-through estimator: forward level x step, backward identity."""
    levels, step = qat_levels(w.detach())
    wq = (levels * step).reshape(w.shape)
    return w + (wq - w).detach()


class QAT:
    """Switches fake quantization on for every grid-bound Linear and the tied embedding."""
    enabled = False


def install_qat(model):
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module.in_features % GROUP == 0:
            module.forward = (lambda m: lambda x: F.linear(x, fake_quant(m.weight) if QAT.enabled else m.weight,
                                                           m.bias))(module)
        elif isinstance(module, torch.nn.Embedding) and name.endswith("embed_tokens"):
            orig = module.forward

            def emb_forward(ids, m=module, orig=orig):
                if not QAT.enabled:
                    return orig(ids)
                w = fake_quant(m.weight)
                scale = getattr(m, "embed_scale", None)
                out = F.embedding(ids, w, m.padding_idx)
                return out * scale.to(out.dtype) if scale is not None else out
            module.forward = emb_forward


# --------------------------------------------------------------------------------------------------- model
def text_config(work=None):
    """The model's text config: TEXT_CONFIG with the changes a work folder's `text_config.json` records (the agent
    model's shape: train_tiny_agent.py prepare --shape)."""
    path = work and Path(work) / "text_config.json"
    changes = json.loads(path.read_text()) if path and path.exists() else {}
    return {**TEXT_CONFIG, **changes}


def build_model(config=None, qk_norm_init=None):
    """A Gemma 4 text model of `config` (default TEXT_CONFIG). qk_norm_init sets the query and key norms' scale:
    Gemma 4 scores attention as q.k of RMS-normalised vectors unscaled (scaling 1.0), so at transformers' init
    (norm weights 1) the scores of head_dim 32 spread with a deviation of ~sqrt(32) and every head starts sharp and
    random; 32**-0.25 per side starts them at deviation 1, as 1/sqrt(d) attention does. The agent model learns to
    copy values about twice as fast from it (train_tiny_agent.py's docstring)."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig
    text = Gemma4TextConfig(**(config or TEXT_CONFIG))
    config = Gemma4Config(text_config=text, vision_config=None, audio_config=None)
    config.eos_token_id = TOP_EOS
    model = Gemma4ForConditionalGeneration(config)
    model.set_attn_implementation("sdpa")
    if qk_norm_init is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    p.fill_(qk_norm_init)
    return model


def batches(data, rng, chat_share):
    """Endless (BATCH, CONTEXT+1) windows: prose windows, and rows of packed chat exchanges (share chat_share)."""
    prose, chats = data["prose"].long(), [c.long() for c in data["chats"]]
    n = CONTEXT + 1
    while True:
        rows = []
        for _ in range(BATCH):
            if rng.random() < chat_share:
                row = []
                while len(row) < n:
                    row += chats[rng.randrange(len(chats))].tolist()
                rows.append(torch.tensor(row[:n]))
            else:
                start = rng.randrange(len(prose) - n)
                rows.append(torch.cat([torch.tensor([2]), prose[start:start + n - 1]]))
        yield torch.stack(rows)


def lr_at(progress, peak, warmup):
    """Linear warm-up, then cosine to 10% of peak, over the fraction of the time budget spent (the schedule follows
    wall-clock time, so the run ends annealed whatever speed the shared machine gives)."""
    if progress < warmup:
        return peak * max(progress, 0.002) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup)))))


def held_out_loss(model, held, limit=64):
    model.eval()
    n = CONTEXT + 1
    losses = []
    with torch.no_grad():
        for i in range(0, min(len(held) - n, limit * (n - 1)), n - 1):
            x = torch.cat([torch.tensor([2]), held[i:i + n - 1]])[None]
            logits = model(input_ids=x[:, :-1]).logits
            losses.append(F.cross_entropy(logits[0], x[0, 1:]).item())
    model.train()
    return sum(losses) / len(losses)


def make_optimizer(model, lr):
    """AdamW (0.9/0.95), weight decay 0.05 on matrices only."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def optimizer_step(model, opt, loss):
    """Backward, gradient norm clipped to 1, one step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    work = args.work
    data = torch.load(work / "tokens.pt")
    tok = Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json"))
    held = torch.tensor(tok.encode((work / "held_out.txt").read_text(), add_special_tokens=False).ids)
    model = build_model()
    install_qat(model)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"parameters {nparams}", flush=True)
    opt = make_optimizer(model, args.lr)
    rng = random.Random(7)
    gen = batches(data, rng, args.chat_share)
    log = open(work / "train_log.jsonl", "a")
    budget = args.minutes * 60
    step, before = 0, 0.0
    ckpt = work / "checkpoint.pt"
    if ckpt.exists():  # resume: the time already spent counts against the budget
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, before = state["step"], state["elapsed"]
        rng.setstate(state["rng"])
    t0 = time.time() - before

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "rng": rng.getstate(),
                    "elapsed": time.time() - t0}, ckpt)
    model.train()
    while (time.time() - t0) < budget:
        progress = (time.time() - t0) / budget
        QAT.enabled = progress >= args.float_fraction
        for g in opt.param_groups:
            g["lr"] = lr_at(progress, args.lr, args.warmup)
        x = next(gen)
        logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        optimizer_step(model, opt, loss)
        step += 1
        rec = dict(step=step, loss=round(loss.item(), 4), lr=opt.param_groups[0]["lr"], qat=QAT.enabled,
                   elapsed=round(time.time() - t0, 1))
        if step % args.eval_every == 0:
            rec["held_out_loss"] = round(held_out_loss(model, held, limit=16), 4)
            save()
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if step % 10 == 0 or "held_out_loss" in rec:
            print(json.dumps(rec), flush=True)
    QAT.enabled = True
    rec = dict(step=step, held_out_loss=round(held_out_loss(model, held, limit=16), 4), qat=True,
               elapsed=round(time.time() - t0, 1), final=True)
    log.write(json.dumps(rec) + "\n")
    save()
    print(f"done: {step} steps in {time.time() - t0:.0f} s", flush=True)


# --------------------------------------------------------------------------------------------------- export
def grid_value(w):
    """The exported bf16 tensor of a QAT weight: level x step, exact in bf16 (checked)."""
    levels, step = qat_levels(w.float())
    exact = (levels * step).reshape(w.shape)
    stored = exact.to(torch.bfloat16)
    if not torch.equal(stored.float(), exact):
        raise SystemExit("a level x step product is not exact in bf16")
    if not torch.equal(step.to(torch.bfloat16).float(), step):
        raise SystemExit("a step is not a bf16 value")
    return stored


def perplexity(model, ids, context=CONTEXT):
    """exp(mean NLL) over non-overlapping windows of `context` tokens, each after <bos> (as `qatserve eval`)."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids), context):
            chunk = ids[i:i + context]
            x = torch.cat([torch.tensor([2]), chunk])[None]
            logits = model(input_ids=x[:, :-1]).logits.float()
            total += F.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
            count += len(chunk)
    return math.exp(total / count), count


def loss_png(log_rows, path):
    """The training-loss curve (and held-out points) drawn with Pillow."""
    from PIL import Image, ImageDraw
    W, H, L, B, T, R = 800, 420, 60, 40, 20, 20
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    steps = [r["step"] for r in log_rows if "loss" in r]
    losses = [r["loss"] for r in log_rows if "loss" in r]
    lo, hi, smax = 0.0, math.ceil(max(losses[min(5, len(losses) - 1):] + [1.0])), max(steps)

    def xy(step, loss):
        return L + (W - L - R) * step / smax, T + (H - T - B) * (1 - (min(loss, hi) - lo) / (hi - lo))
    d.rectangle([L, T, W - R, H - B], outline="black")
    for v in range(int(lo), int(hi) + 1):
        y = xy(0, v)[1]
        d.line([L - 4, y, L, y], fill="black")
        d.text((L - 30, y - 6), f"{v}", fill="black")
    for k in range(0, 6):
        s = smax * k / 5
        x = xy(s, lo)[0]
        d.line([x, H - B, x, H - B + 4], fill="black")
        d.text((x - 12, H - B + 8), f"{int(s)}", fill="black")
    smooth, acc = [], None
    for v in losses:
        acc = v if acc is None else 0.9 * acc + 0.1 * v
        smooth.append(acc)
    d.line([xy(s, v) for s, v in zip(steps, losses)], fill=(190, 200, 230), width=1)
    d.line([xy(s, v) for s, v in zip(steps, smooth)], fill=(20, 60, 200), width=2)
    held = [(r["step"], r["held_out_loss"]) for r in log_rows if "held_out_loss" in r]
    for s, v in held:
        x, y = xy(s, v)
        d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=(200, 30, 30))
    qat = next((r["step"] for r in log_rows if r.get("qat")), None)
    if qat:
        x = xy(qat, lo)[0]
        d.line([x, T, x, H - B], fill=(120, 120, 120))
        d.text((x + 4, T + 4), "QAT on", fill=(80, 80, 80))
    d.text((L + 8, H - B - 34), "training loss (blue, EMA 0.9), held-out loss (red), nats/token", fill="black")
    d.text((W // 2 - 20, H - 18), "step", fill="black")
    img.save(path)


PROSE_PROMPT = "It is a truth universally acknowledged, that"
CHAT_PROMPT = "Who wrote Emma?"


def greedy_ids(model, prompt_ids, max_new):
    """transformers' greedy continuation (float32), stopping at <eos> / <turn|> (not included)."""
    ids = torch.tensor([prompt_ids])
    new = model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=TOP_EOS,
                         pad_token_id=0)[0, ids.shape[1]:].tolist()
    stopped = bool(new) and new[-1] in TOP_EOS
    return (new[:-1] if stopped else new), stopped


def greedy_reference(model, tok, out):
    """reference_greedy.txt: transformers' float32 greedy ids on the export, for ctest trained_model."""
    import jinja2
    template = jinja2.Environment().from_string((out / "chat_template.jinja").read_text())
    chat_text = template.render(messages=[{"role": "user", "content": CHAT_PROMPT}], add_generation_prompt=True,
                                bos_token="<bos>")
    prose = [2] + tok.encode(PROSE_PROMPT, add_special_tokens=False).ids
    chat = tok.encode(chat_text, add_special_tokens=False).ids
    prose_new, prose_stop = greedy_ids(model, prose, 16)
    chat_new, chat_stop = greedy_ids(model, chat, 48)
    lines = ["# transformers float32 greedy decoding of this directory (tools/python/train_tiny_qat.py export);",
             "# ids exclude the stop token; finish is stop (<eos> or <turn|>) or length.",
             f"prose_prompt: {PROSE_PROMPT}", f"prose_prompt_ids: {','.join(map(str, prose))}",
             f"prose_ids: {','.join(map(str, prose_new))}", f"prose_finish: {'stop' if prose_stop else 'length'}",
             f"prose_text: {json.dumps(tok.decode(prose_new))}",
             f"chat_prompt: {CHAT_PROMPT}", f"chat_prompt_ids: {','.join(map(str, chat))}",
             f"chat_ids: {','.join(map(str, chat_new))}", f"chat_finish: {'stop' if chat_stop else 'length'}",
             f"chat_text: {json.dumps(tok.decode(chat_new))}"]
    (out / "reference_greedy.txt").write_text("\n".join(lines) + "\n")
    return {"prose": tok.decode(prose_new), "chat": tok.decode(chat_new), "chat_finish": chat_stop}


def export(args):
    import shutil
    from transformers import Gemma4ForConditionalGeneration
    from gemma4_fixture_config import generation_config, google_style_config, write_json
    work, out = args.work, args.out
    config = text_config(work)
    model = build_model(config)
    state = torch.load(work / "checkpoint.pt")
    model.load_state_dict(state["model"])
    with torch.no_grad():
        for name, module in model.named_modules():
            if (isinstance(module, torch.nn.Linear) and module.in_features % GROUP == 0 and
                    not name.endswith("lm_head")) or name.endswith(".embed_tokens"):
                module.weight.copy_(grid_value(module.weight).float())
    if out.exists():
        shutil.rmtree(out)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    spec = {"text": config, "top_eos": TOP_EOS, "gen": dict(bos_token_id=2, pad_token_id=0, eos_token_id=TOP_EOS)}
    saved = json.loads((out / "config.json").read_text())
    write_json(out / "config.json", google_style_config(spec, saved))
    write_json(out / "generation_config.json", generation_config(spec))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(work / "tokenizer" / f, out / f)
    shutil.copyfile(work / "held_out.txt", out / "held_out.txt")
    shutil.copyfile(work / "train_log.jsonl", out / "train_log.jsonl")

    # Check the export as a user loads it: transformers (float32) from the directory.
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    held = torch.tensor(tok.encode((out / "held_out.txt").read_text(), add_special_tokens=False).ids)
    m32 = Gemma4ForConditionalGeneration.from_pretrained(out, dtype=torch.float32)
    rows = [json.loads(line) for line in (work / "train_log.jsonl").read_text().splitlines()]
    loss_png(rows, out / "loss.png")
    steps = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "held_out_loss" in r]  # a stopped run's last row has none
    greedy = greedy_reference(m32, tok, out)
    print(json.dumps(greedy), flush=True)
    ppl, n = perplexity(m32, held)
    summary = dict(steps=rows[-1]["step"], train_seconds=rows[-1]["elapsed"], final_train_loss=steps[-1]["loss"],
                   final_held_out_loss_sample=evals[-1]["held_out_loss"],
                   held_out_tokens=n, held_out_perplexity_f32=round(ppl, 3),
                   parameters=sum(p.numel() for p in m32.parameters()),
                   greedy=greedy)
    (out / "export_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--work", type=Path, default=REPO / "out" / "train")
    p.add_argument("--chats", type=int, default=20000)
    p.add_argument("--bare-words", action="store_true",
                   help="no merge joins a space to a word (make_demo_tokenizer.words): the agent model's tokenizer")
    t = sub.add_parser("train")
    t.add_argument("--work", type=Path, default=REPO / "out" / "train")
    t.add_argument("--minutes", type=float, default=60, help="wall-clock budget; the schedule follows it")
    t.add_argument("--lr", type=float, default=4e-3)
    t.add_argument("--warmup", type=float, default=0.03, help="fraction of the budget")
    t.add_argument("--float-fraction", type=float, default=0.4)
    t.add_argument("--chat-share", type=float, default=0.15)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--threads", type=int, default=2)
    e = sub.add_parser("export")
    e.add_argument("--work", type=Path, default=REPO / "out" / "train")
    e.add_argument("--out", type=Path, required=True, help="the checkpoint directory to write")
    args = ap.parse_args()
    {"prepare": prepare, "train": train, "export": export}[args.cmd](args)


if __name__ == "__main__":
    main()
