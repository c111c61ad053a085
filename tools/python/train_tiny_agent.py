#!/usr/bin/env python3
"""train_tiny_agent.py: teach the demo model agent work (tool calls, answers from tool results, JSON, thoughts) on a
mix of its old data (Austen prose and chats) and agent conversations (tools/python/agent_data.py), from random
weights, a copying stage's weights or an exported checkpoint, with quantization-aware training; then export it as
train_tiny_qat.py does. The recipe so far (both cores; a tokenizer whose words never carry their leading space, so
that a value has the same tokens in a request as in a call or a JSON string and writing it is copying; a first
stage that learns only to copy, probe_agent_copy.py's JSON extraction; then the mix from its weights):

    .venv/bin/python tools/python/train_tiny_qat.py prepare --work out/train-bare --bare-words
    .venv/bin/python tools/python/probe_agent_copy.py json --piece-names --invented-share 0.5 --threads 2 \
        --shape '{"num_key_value_heads": 4}' --qk-norm-init 0.42 --steps 2500 --eval-every 250 --save out/copy.pt
    .venv/bin/python tools/python/train_tiny_agent.py prepare --work out/train-agent --base-work out/train-bare \
        --examples 30000 --piece-names --invented-share 0.7 --invented-tools 0.8 --shape '{"num_key_value_heads": 4}'
    .venv/bin/python tools/python/train_tiny_agent.py train --work out/train-agent --start out/copy.pt \
        --steps 3300 --lr 3e-3 --warmup 0.02 --float-fraction 0.7 --agent-share 0.6 --copy-share 0.05
    .venv/bin/python tools/python/train_tiny_qat.py export --work out/train-agent --out DIR
    .venv/bin/python tools/python/eval_agent_demo.py build/qatserve --model DIR

(`prepare --init models/gemma4-tiny-qat` continues the demo model instead, with its tokenizer.) Steps alternate
between a batch of the old kind (8 rows of 256 tokens: prose windows or packed chats, every token scored) and an
agent batch (2 rows of 1,024 tokens of packed examples; only the model's own turns are scored, since the prompts'
tool declarations are input, not something to write). `--float-fraction` trains the first part of the schedule
without fake quantization (0, the default, suits a start already on the grid); the export is lossless only if QAT
ends the run, as it always does. `--start CKPT` continues from weights, `--resume` a stopped run. `probe` looks at
a checkpoint.

Measured (2026-12-07, AMD EPYC Zen 3, 2 cores; `probe` greedy on held-out requests, eval_agent_demo.py through the
server on the int4 repack):
  - Continuing the demo model (its tokenizer: a value after a space is `▁O s ak a`, after a quote `O s ak a`), with
    more calls, a copying drill (`--copy-share`) or a spelling drill (`--spell-share`): calls and JSON well formed,
    0/16 held-out calls, arguments memorised training values. From scratch with `--bare-words` (copy drill 0.1-0.35,
    3,130 steps): copy loss 0.64, still 0/40 ("Henry Woodhouse", "Boston"); with 90% of cities and people invented
    syllable names: arguments invented-looking ("Wynven"), still not the request's.
  - probe_agent_copy.py (JSON extraction only, from random weights; held-out = whole answers right under teacher
    forcing, of 150; one thread a run unless said):
      shape                                   rows  steps  train loss  held-out
      TEXT_CONFIG (one KV head)               4     1400   0.48        23
      4 KV heads                              4     1400   0.40        49
      4 KV heads, q/k norm init 0.42          4      800   0.19        49    (0.46 and 30 without the init)
      4 KV heads, q/k norm init 0.42          4     1500   0.01        53
      the same, --piece-names, invented 0.5   8      700   0.46        53
      the recipe's stage (same, 2 threads)    8     1250   0.25        56
                                              8     1500   0.03        75
                                              8     2000   0.05        91
                                              8     2500   0.02       105    (token accuracy 0.986)
      the same, hidden 256, MLP 768 (2.5x)    8      750   0.19        53    (1.8 s a step, 2,500-step schedule)
                                              8     1000   0.20        81
                                              8     1250   0.08        84    (stopped)
    53 is exactly the held-out examples without a name or a city: numbers are copied from step ~500, names not until
    ~1,250, and only names drawn from the tokenizer's pieces teach it (names of 22 syllables teach copying those
    tokens: train loss 0.01, held-out names still wrong). One KV head and transformers' q/k norm init (Gemma 4
    scores unscaled q.k of normalised vectors) learn it more slowly. Pure induction on random tokens
    (`probe_agent_copy.py induction`) does not move off the uniform loss in 300 steps; the full mix from random
    weights with all of the above, 1,940 steps: copy loss ~0.9, 0/30. The copying stage first is what worked. The
    wider shape (7.6 M parameters, 3.0 M before) copies names some 500 steps sooner but takes 1.8x as long a step:
    per minute of the 2-core machine it learns no faster (84 after 38 minutes; the recipe's shape 91 after ~32).
  - The mix from the copying stage (2,500 steps, 40 minutes), tool names as before (no `--invented-tools`), 2,100
    float steps of a 3,600-step schedule (~1 s a step), exported to int4, eval_agent_demo.py: json 100% (goal 95%),
    think 96.7% (90%), no_call 100%, result 45%, call 0%. Calls had the request's arguments and a memorised
    training tool's name (`subtract 484 and 17` -> `max_two{a:484,b:17}`, `population of Seattle` ->
    `lookup_pock_poation{city:"Seattle"}`): a training tool's name could be remembered, a held-out one's only
    copied from its declaration. Results cut six-digit numbers to four (training results had at most four digits)
    and missed a status no training result had ("ringing").
  - So `prepare --invented-tools` names generated tools by invented words, and training results now have up to six
    digits and invented words (agent_tools.result_value).
  - With `--invented-tools 0.6` (the results change came later), from the same copying stage, 2,700 steps (QAT from
    1,890; 47 minutes), int4 through the server: call 28.3% (0 before), result 60%, json 100% with every value the
    request's (77.5% before), think 100%, no_call 90%; held-out prose 2.67 nats a (bare-words) token, f32
    perplexity 15.4. The misses: `lookup_population` for `get_population` (the verb taken from the request's
    "Look up", not from the declaration), parameter names of the training pools (`first`/`second` for `a`/`b`,
    `town` for `dish`), a person's call made as a lookup; results still cut six-digit numbers.
  - So verbs and parameter names are now invented too (agent_tools.or_invented, half the share). With them, the
    results change and `--invented-tools 0.8`, from the same copying stage, 3,300 steps (57 minutes): the recipe
    above, stage 2 of models/gemma4-tiny-qat (the demo model since 2026-12-07; its model card). Through the server: result 97.5% (60% before), json 100%,
    think 100%, no_call 70%; calls 20% by the model alone (`eval_agent_demo.py --free-calls`), 40% as served (a call
    the model opens held to the declared tools' names and parameters). Alone it now copies held-out tool names but
    cannot end them (`subtractct`, `find_recipepe`); with the grammar the misses are the wrong declared tool
    (`check_timezone` for a population) and values copied wrongly (`pciding` for `pudding`, `b: 381` for 38).
    Held-out prose: f32 perplexity 14.75.
  - Then more calls from that export (`prepare --init` it, `--mix call=0.55,...`, 1,400 QAT steps at lr 1e-3, 26
    minutes; the demo model's stage 3): calls 66.7% as served, 41.7% alone, json values 97.5% exact, the other
    kinds unchanged, prose perplexity 14.54. The misses left are values copied wrongly (`Oachel Reed`) and a
    person's call made with another declared tool.
  - A fourth such stage from that export on fresh examples (`prepare --seed 20261207 --mix call=0.55,no_call=0.15,
    result=0.1,json=0.08,think=0.12`, 2,000 steps at lr 8e-4, `--copy-share 0.08`, 47 minutes): calls 63.3%,
    no_call 50%, json 97.5% (values 90% exact): worse, not kept. More of the same data does not teach the
    held-out tool choice ("Call Clara Ward." -> `fetch_platform{id:"Clara Ward"}`, not `call_person`).
  - Stages 3 and 4 ran `prepare` without stage 2's name flags (real tool names only, people and places of 22
    syllables). With them (`--piece-names --invented-share 0.7 --invented-tools 0.8 --seed 20261208`, stage 3's mix
    and schedule from the demo model, 26 minutes): calls 63.3% as served, 38.3% alone, json 100% (values 95%
    exact), result 97.5%, think 100%, no_call 70%, held-out prose loss 2.588 (2.60 before): no gain in calls, not
    kept. Its misses: two-word values (`Rachel Rachel`, `Victor Frostor`), an optional parameter added
    (`video: false`), and held-out tools never chosen for their request (`find_recipe`, `get_population`). Calls
    sit at 63-67% across these stages: the next step is data that makes the declared tool the only cue (distractors
    sharing the request's words), or a larger model, not more of this mix.
  - That data (agent_tools.person_tool: actions on a person named by the verb alone, `notify_contact` for "Notify
    Anne Elliot."; `Tool.sibling`: the chosen tool declared beside one differing in one word; arithmetic operands of
    1-3 digits, each length as likely), from the demo model: `prepare --seed 20261209 --piece-names --invented-share
    0.7 --invented-tools 0.7 --person-tools 0.25 --siblings 0.5 --even-digits` and stage 3's mix, `train --steps
    1600` at lr 1e-3 (29 minutes): calls 60% as served (50% at step 600, 61.7% at 1,200), no_call 65%, result 97.5%,
    json 100% with every value exact, think 100%. Every person's call now picks call_person ("Call Clara Ward." and
    "Call Daniel Moss." did not), but lowercase values are copied worse (`scip` for `soup`, `pciding` for `pudding`,
    `bcipe for` for `bread`): training word values were 30 words, while names and codes were invented. Operands are
    still continued past their end (`b: 143` for 14 after `a: 643`).
  - So word values are also drawn from the prose's lowercase words (`--prose-words 0.8`, agent_tools.use_words; a
    lookup of a word's noun at half that share). From that stage's export (`prepare --seed 20261210 ...
    --person-tools 0.2 --siblings 0.5 --even-digits --prose-words 0.8`), stopped at step 600 of 1,400: calls 48.3%
    (that stage scored 50% at its step 600), dishes still `scip`, `pcipe for`.
  - The sliding window: the demo shape's sliding layers see 64 tokens, and a prompt's tool declarations lie 100-400
    tokens before the call, so only the two full-attention layers (one with K/V of its own) can read the declared
    names. From the demo model with `--shape '{"num_key_value_heads": 4, "sliding_window": 512}'` (E2B's window) and
    the data just above (`prepare --seed 20261211`), 1,200 steps at lr 1e-3 (27 minutes, 1.35 s a step): calls 56.7%
    (at step 600 as well), no_call 70%, result 97.5%, json 100% (values 87.5% exact), think 100%. The misses are the
    same copies (`pciding`, `Ward Ward`, `b: 587`) and some person calls made with another tool.
  - So five stages of 1,200-2,000 steps after the demo model's (from it or from one another), each data change
    aimed at the misses the last showed, land at calls 57-67%: each fixes some misses and brings others. A
    held-out name that is one token (`Eleanor`, `William`: written `Frost`, `Ward Ward`) is copied in no stage;
    agent_tools.use_capitals (`--capital-names`) makes training names of such tokens, not yet trained.
"""
import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_tiny_qat as base  # noqa: E402
from agent_data import TRAIN, AgentExamples  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
AGENT_CONTEXT = 1024
AGENT_ROWS = 2


def small_talk(work):
    """(question, answer) pairs of the old chat data (greetings, Austen questions): what to answer when no tool
    fits, and the thinking examples' answers."""
    rng = random.Random(5)
    novels_dir = work / "base"
    paras = [p for p in (novels_dir / "train.txt").read_text().splitlines() if p]
    sents = {"all": base.sentences_of(paras)}
    pairs = [turns[0] for turns in base.chat_examples(rng, sents, 4000)]
    return [(q, a) for q, a in pairs if len(a) < 160]


def prepare(args):
    """Copies the base data and tokenizer, loads the starting checkpoint, and renders the agent examples."""
    work, src = args.work, args.base_work
    work.mkdir(parents=True, exist_ok=True)
    (work / "base").mkdir(exist_ok=True)
    for f in ("train.txt", "held_out.txt", "tokens.pt"):
        shutil.copyfile(src / f, work / "base" / f)
    shutil.copyfile(src / "held_out.txt", work / "held_out.txt")
    tokenizer_from = args.init or src / "tokenizer"
    shutil.copytree(tokenizer_from, work / "tokenizer", dirs_exist_ok=True,
                    ignore=lambda d, names: [n for n in names if n not in ("tokenizer.json", "tokenizer_config.json",
                                                                           "chat_template.jinja")])
    tok = Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json"))
    base_tok = Tokenizer.from_file(str(src / "tokenizer" / "tokenizer.json"))
    if tok.to_str() != base_tok.to_str():
        raise SystemExit(f"{src}/tokenizer differs from {tokenizer_from}'s: the base token streams would not match")
    import agent_tools
    if args.invented_share is not None:
        agent_tools.INVENTED_SHARE = {"city": args.invented_share, "person": args.invented_share}
    if args.piece_names:
        agent_tools.use_pieces(tok.get_vocab())
    agent_tools.INVENTED_TOOL_SHARE = args.invented_tools
    agent_tools.PERSON_TOOL_SHARE = args.person_tools
    agent_tools.SIBLING_SHARE = args.siblings
    agent_tools.EVEN_DIGITS = args.even_digits
    if args.capital_names:
        agent_tools.CAPITAL_SHARE = args.capital_names
        agent_tools.use_capitals(tok.get_vocab())
    if args.prose_words:
        agent_tools.PROSE_WORD_SHARE = args.prose_words
        agent_tools.use_words((work / "base" / "train.txt").read_text())
    gen = AgentExamples(work / "tokenizer" / "chat_template.jinja", TRAIN, args.seed, small_talk(work))
    if args.mix:
        gen.MIX = parse_mix(args.mix)
    examples, kinds = [], {}
    for _ in range(args.examples):
        e = gen.sample()
        p = tok.encode(e.prompt, add_special_tokens=False).ids
        t = tok.encode(e.target, add_special_tokens=False).ids
        if len(p) + len(t) > AGENT_CONTEXT:
            continue
        examples.append((torch.tensor(p + t, dtype=torch.int16), len(p)))
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    torch.save(examples, work / "agent_tokens.pt")
    (work / "text_config.json").write_text(json.dumps(json.loads(args.shape)) + "\n")
    torch.manual_seed(1)
    start = base.build_model(base.text_config(work), args.qk_norm_init)
    if args.init:
        from safetensors.torch import load_file
        state = {k: v.float() for k, v in load_file(args.init / "model.safetensors").items()}
        missing, unexpected = start.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith("lm_head.weight")]
        if missing or unexpected:
            raise SystemExit(f"{args.init}: checkpoint does not match the model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
    torch.save({"model": start.state_dict()}, work / "init.pt")
    info = dict(examples=len(examples), kinds=kinds, target_tokens=sum(len(x) - p for x, p in examples),
                tokens=sum(len(x) for x, _ in examples), init=args.init.name if args.init else "random", seed=args.seed)
    (work / "prepare_agent.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


def parse_mix(text):
    """`call=0.5,json=0.3,...` -> AgentExamples.MIX: the kinds' shares, normalised."""
    pairs = [(k, float(v)) for k, v in (item.split("=") for item in text.split(","))]
    total = sum(v for _, v in pairs)
    return tuple((k, v / total) for k, v in pairs)


def agent_batches(examples, rng):
    """Endless (AGENT_ROWS, AGENT_CONTEXT + 1) rows of packed examples with a mask of the scored positions."""
    n = AGENT_CONTEXT + 1
    while True:
        rows, masks = [], []
        for _ in range(AGENT_ROWS):
            ids, mask = [], []
            while len(ids) < n:
                x, p = examples[rng.randrange(len(examples))]
                ids += x.tolist()
                mask += [0] * p + [1] * (len(x) - p)
            rows.append(torch.tensor(ids[:n]))
            masks.append(torch.tensor(mask[:n], dtype=torch.bool))
        yield torch.stack(rows), torch.stack(masks)


def agent_loss(model, x, mask):
    """Mean loss over the scored positions of packed agent rows. Only positions some row scores go through the LM
    head (a seventh of them: the prompts' tool declarations are input), which saves a quarter of a step."""
    keep = mask[:, 1:].any(0).nonzero().squeeze(1)
    logits = model(input_ids=x[:, :-1], logits_to_keep=keep).logits
    targets, m = x[:, 1:][:, keep], mask[:, 1:][:, keep].float()
    per = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return (per * m.reshape(-1)).sum() / m.sum().clamp_min(1)


def copy_batches(examples, rng):
    """Endless rows shaped as agent_batches' of a copying drill: a window of some example's tokens, other text, then
    the window again, scored (but for its first token, which nothing predicts). Every scored token is a copy, at
    distances inside and beyond the sliding window: the drill grows the heads that find an earlier occurrence and
    continue it (induction), which the agent data alone, a few copied tokens per 370, did not grow."""
    n = AGENT_CONTEXT + 1

    def window(length):
        x, _ = examples[rng.randrange(len(examples))]
        start = rng.randrange(max(1, len(x) - length))
        return x[start:start + length].tolist()
    while True:
        rows, masks = [], []
        for _ in range(AGENT_ROWS):
            ids, mask = [], []
            while len(ids) < n:
                seg, filler = window(rng.randint(3, 40)), window(rng.randint(0, 90))
                ids += seg + filler + seg
                mask += [0] * (len(seg) + len(filler)) + [0] + [1] * (len(seg) - 1)
            rows.append(torch.tensor(ids[:n]))
            masks.append(torch.tensor(mask[:n], dtype=torch.bool))
        yield torch.stack(rows), torch.stack(masks)


SPELL_ASKS = ["What is the {k} of {w}?", "{w} is the {k}.", "The {k} is {w}.", "Look up {w}, please.", "Tell me about {w}.",
              "Use {w} as the {k}.", "{w}"]
SPELL_ANSWERS = ['<|"|>{w}<|"|>', '{{"{k}": "{w}"}}', '{k}:<|"|>{w}<|"|>}}', '"{k}": "{w}", ']


def spell_words(work):
    """Words a request may name: the prose's word types (as written and capitalised), the training split's names and
    cities, invented place names and numbers; never a held-out value (those measure the skill on unseen words)."""
    import re
    import agent_tools as at
    held = set(at.CITIES[at.HELD_OUT] + at.FIRST[at.HELD_OUT] + at.LAST[at.HELD_OUT] + at.WORDS[at.HELD_OUT])
    prose = set(re.findall(r"[A-Za-z]+", (work / "base" / "train.txt").read_text()))
    words = prose | {w.capitalize() for w in prose} | set(at.CITIES[at.TRAIN] + at.FIRST[at.TRAIN] + at.LAST[at.TRAIN])
    return sorted(w for w in words if w not in held and len(w) > 1)


def spell_batches(work, tok, rng):
    """Endless rows shaped as agent_batches' of a spelling drill. In a request a value follows a space (`▁Osaka` is
    `▁O s ak a`), in a tool call or JSON string it follows a quote (`O s ak a`): the first token differs, so a
    call's value is not a copy of the request's tokens, and the copying drill alone does not teach it. Each unit is a
    sentence naming a word, a little other text, then the word quoted as a call or JSON value; the quoted word's
    tokens are scored."""
    import agent_tools as at
    words = spell_words(work)
    keys = ["city", "name", "place", "word", "query", "to", "title", "room", "dish", "a", "x", "value"]
    n = AGENT_CONTEXT + 1

    def word():
        x = rng.random()
        if x < 0.15:
            return str(rng.randint(0, 99999))
        if x < 0.3:
            return at.city(rng, at.TRAIN) if rng.random() < 0.5 else at.person(rng, at.TRAIN)
        return rng.choice(words)
    while True:
        rows, masks = [], []
        for _ in range(AGENT_ROWS):
            ids, mask = [], []
            while len(ids) < n:
                w, k = word(), rng.choice(keys)
                ask = tok.encode(" " + rng.choice(SPELL_ASKS).format(w=w, k=k) + "\n", add_special_tokens=False).ids
                answer = rng.choice(SPELL_ANSWERS).format(w=w, k=k)
                enc = tok.encode(answer, add_special_tokens=False)
                start = answer.index(w) if not w.isdigit() else answer.rindex(w)
                scored = [int(b > start and a < start + len(w) + 1) for a, b in enc.offsets]
                ids += ask + enc.ids
                mask += [0] * len(ask) + scored
            rows.append(torch.tensor(ids[:n]))
            masks.append(torch.tensor(mask[:n], dtype=torch.bool))
        yield torch.stack(rows), torch.stack(masks)


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(2)
    work = args.work
    data = torch.load(work / "base" / "tokens.pt")
    examples = torch.load(work / "agent_tokens.pt")
    tok = Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json"))
    held = torch.tensor(tok.encode((work / "held_out.txt").read_text(), add_special_tokens=False).ids)
    model = base.build_model(base.text_config(work))
    base.install_qat(model)
    resumed = torch.load(args.resume) if args.resume else None
    model.load_state_dict((resumed or torch.load(args.start or work / "init.pt"))["model"])
    opt = base.make_optimizer(model, args.lr)
    if resumed:
        opt.load_state_dict(resumed["opt"])
    step = resumed["step"] if resumed else 0
    rng = random.Random(11 + step)
    old, agent = base.batches(data, rng, args.chat_share), agent_batches(examples, rng)
    drill, spell = copy_batches(examples, rng), spell_batches(work, tok, rng)
    log = open(work / "train_log.jsonl", "a")
    budget, t0 = args.minutes * 60, time.time() - (resumed["elapsed"] if resumed else 0)
    ckpt = work / "checkpoint.pt"

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": time.time() - t0},
                   ckpt)
    model.train()

    def progress():
        """How far the learning-rate schedule is: by steps when --steps is given (a shared, busy machine then stretches
        the run instead of spending the schedule on waiting), else by the time budget."""
        return step / args.steps if args.steps else (time.time() - t0) / budget
    while progress() < 1:
        base.QAT.enabled = progress() >= args.float_fraction
        for g in opt.param_groups:
            g["lr"] = base.lr_at(progress(), args.lr, args.warmup)
        pick = rng.random()
        kind = "copy_loss" if pick < args.copy_share else \
            "spell_loss" if pick < args.copy_share + args.spell_share else \
            "agent_loss" if pick < args.copy_share + args.spell_share + args.agent_share else "loss"
        if kind != "loss":
            x, mask = next({"copy_loss": drill, "spell_loss": spell, "agent_loss": agent}[kind])
            loss = agent_loss(model, x, mask)
        else:
            x = next(old)
            logits = model(input_ids=x[:, :-1]).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        base.optimizer_step(model, opt, loss)
        step += 1
        rec = dict(step=step, **{kind: round(loss.item(), 4)},
                   lr=opt.param_groups[0]["lr"], qat=base.QAT.enabled, elapsed=round(time.time() - t0, 1))
        if step % args.eval_every == 0:
            rec["held_out_loss"] = round(base.held_out_loss(model, held, limit=16), 4)
            save()
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if step % 10 == 0 or "held_out_loss" in rec:
            print(json.dumps(rec), flush=True)
    base.QAT.enabled = True
    rec = dict(step=step, held_out_loss=round(base.held_out_loss(model, held, limit=16), 4), qat=True,
               elapsed=round(time.time() - t0, 1), final=True)
    log.write(json.dumps(rec) + "\n")
    save()
    print(f"done: {step} steps in {time.time() - t0:.0f} s", flush=True)


@torch.no_grad()
def probe(args):
    """A quick look during training (not the evaluation: that is eval_agent_demo.py through the server): greedy
    continuations of held-out examples by the PyTorch model from a checkpoint, and the share whose target text
    comes out exactly, per kind."""
    from agent_data import HELD_OUT
    torch.set_num_threads(args.threads)
    work = args.work
    tok = Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json"))
    model = base.build_model(base.text_config(work))
    base.install_qat(model)
    base.QAT.enabled = args.qat
    model.load_state_dict(torch.load(args.start or work / "checkpoint.pt")["model"])
    model.eval()
    gen = AgentExamples(work / "tokenizer" / "chat_template.jinja", HELD_OUT, 7, small_talk(work))
    exact, seen = {}, {}
    for _ in range(args.n):
        e = gen.sample()
        ids = tok.encode(e.prompt, add_special_tokens=False).ids
        want = tok.encode(e.target, add_special_tokens=False).ids
        out = model.generate(torch.tensor([ids]), max_new_tokens=len(want), do_sample=False)[0, len(ids):].tolist()
        seen[e.kind] = seen.get(e.kind, 0) + 1
        exact[e.kind] = exact.get(e.kind, 0) + (out == want)
        if args.show:
            print(e.kind, "|", tok.decode(out, skip_special_tokens=False)[:120])
    print(json.dumps({k: f"{exact[k]}/{seen[k]}" for k in sorted(seen)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--work", type=Path, default=REPO / "out" / "train-agent")
    p.add_argument("--base-work", type=Path, default=REPO / "out" / "train")
    p.add_argument("--init", type=Path, help="start from this checkpoint directory (default: random weights, the "
                                             "tokenizer of --base-work)")
    p.add_argument("--examples", type=int, default=60000)
    p.add_argument("--invented-share", type=float,
                   help="share of training cities and people given invented names (default: agent_tools')")
    p.add_argument("--piece-names", action="store_true",
                   help="invent names from the tokenizer's word pieces (agent_tools.use_pieces), not 22 syllables")
    p.add_argument("--invented-tools", type=float, default=0.0,
                   help="share of generated training tools named by an invented word (agent_tools.INVENTED_TOOL_SHARE)")
    p.add_argument("--person-tools", type=float, default=0.0,
                   help="share of generated training tools acting on a person named by the verb alone "
                        "(agent_tools.person_tool)")
    p.add_argument("--siblings", type=float, default=0.0,
                   help="share of requests whose tool is declared beside a sibling differing in one word")
    p.add_argument("--prose-words", type=float, default=0.0,
                   help="share of word values drawn from the prose's lowercase words (and half of it: lookups of "
                        "a word)")
    p.add_argument("--even-digits", action="store_true",
                   help="arithmetic operands of 1-3 digits, each length as likely (default: 0-999 evenly)")
    p.add_argument("--capital-names", type=float, default=0.0,
                   help="share of invented name words that are one capitalised word token (agent_tools.use_capitals)")
    p.add_argument("--shape", default="{}",
                   help='the model shape\'s changes to train_tiny_qat.TEXT_CONFIG, e.g. {"num_key_value_heads": 4}')
    p.add_argument("--qk-norm-init", type=float, help="initial query/key norm scale (train_tiny_qat.build_model)")
    p.add_argument("--mix", help="kinds' shares, e.g. call=0.5,json=0.3,result=0.2 (default: agent_data's MIX)")
    p.add_argument("--seed", type=int, default=20261205,
                   help="the examples' seed (a later stage from --init takes another for examples it has not seen)")
    t = sub.add_parser("train")
    t.add_argument("--work", type=Path, default=REPO / "out" / "train-agent")
    t.add_argument("--minutes", type=float, default=50)
    t.add_argument("--steps", type=int, help="run this many steps (the schedule follows them) instead of --minutes")
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--warmup", type=float, default=0.02)
    t.add_argument("--agent-share", type=float, default=0.6)
    t.add_argument("--copy-share", type=float, default=0.0, help="share of steps on the copying drill")
    t.add_argument("--spell-share", type=float, default=0.0, help="share of steps on the spelling drill")
    t.add_argument("--chat-share", type=float, default=0.25)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--float-fraction", type=float, default=0.0,
                   help="share of the schedule trained without fake quantization before QAT (0: QAT throughout, for "
                        "a start already on the grid)")
    t.add_argument("--start", type=Path, help="weights to start from (a checkpoint.pt); default: prepare's init.pt")
    t.add_argument("--resume", type=Path, help="continue a run from its checkpoint.pt (weights, optimizer, step, "
                                                "time): the same --steps schedule, across sessions")
    q = sub.add_parser("probe", help="greedy held-out examples from a checkpoint, exact-match share per kind")
    q.add_argument("--work", type=Path, default=REPO / "out" / "train-agent")
    q.add_argument("--start", type=Path, help="checkpoint (default: the work folder's checkpoint.pt)")
    q.add_argument("-n", type=int, default=60)
    q.add_argument("--threads", type=int, default=1)
    q.add_argument("--qat", action="store_true", help="run with fake quantization (as the export will)")
    q.add_argument("--show", action="store_true")
    args = ap.parse_args()
    {"prepare": prepare, "train": train, "probe": probe}[args.cmd](args)


if __name__ == "__main__":
    main()
