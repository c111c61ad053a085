#!/usr/bin/env python3
"""train_tiny_assistant.py: train a Gemma 4 assistant drafter (transformers' Gemma4AssistantForCausalLM) against the
frozen demo model models/gemma4-tiny-qat, with quantization-aware training on the group-32 int4 grid, and export it
as a bf16 QAT checkpoint beside it (models/gemma4-tiny-qat-assistant) that `qatserve repack` packs losslessly.

    .venv/bin/python tools/python/train_tiny_qat.py prepare --work out/train             # the demo's data (~1 min)
    nice -n 5 .venv/bin/python tools/python/train_tiny_assistant.py rollouts               # target greedy text
    nice -n 5 .venv/bin/python tools/python/train_tiny_assistant.py train --minutes 25
    .venv/bin/python tools/python/train_tiny_assistant.py export          # + the check against transformers' step

Data: distillation on the target's own greedy decoding. `rollouts` takes prompts from the demo's training data
(`train_tiny_qat.py prepare`: 32-token windows of the Austen training prose after <bos>, and the synthetic chat
prompts up to the model's turn) and lets the target (transformers, float32) continue each greedily: prose for 160
tokens, chat answers until <turn|> (at most 64). Held-out text is never used (the acceptance is measured on it).

Training (teacher forcing, the target frozen): for a row x_0..x_{L-1} the target gives its final-normed hidden state
h_t, the K/V of its last K/V-computing layer of each type, and its greedy pick g_{t+1} = argmax logits_t at every
position in one pass. The drafting step of transformers' SinglePositionMultiTokenCandidateGenerator after position t
(query at position t+1 over the target's K/V at 0..t, sliding layers at t-W..t) is run for every t at once: causal
masks over the target's K/V (the sliding one a position wider than the target's own), queries shifted one position. Draft 1 feeds cat(target scaled embedding of
x_{t+1}, h_t) and is trained toward g_{t+2}; draft j+1 feeds the target's greedy token that draft j should have
proposed and draft j's post_projection output (the chain is trained through, gradients flow along it), toward
g_{t+j+1}. Past the prompt the row IS the target's greedy text, so g_{t+j+1} is exactly what the target picks after
the accepted drafts; inside the prompt only draft 1's label is defined that way, later drafts are masked. Loss per
draft: cross-entropy to the greedy token plus KL(target || drafter) on the target's soft-capped distribution.

QAT: train_tiny_qat.py's fake quantizer (imported: 5-significant-bit steps, so level x step is exact in bf16) on
every assistant Linear (pre/post_projection, q/o_proj, the MLP) and the tied head (embed_tokens), switched on for
the last `--qat-fraction` of the time budget; the export writes those weights on the grid.

Model (ASSISTANT_TEXT): hidden 128 = the target's (so the head and the projections start from the target's own
embedding: the drafter begins as "the target's head on the target's state"), 2 layers [sliding, full] so that it
reads both K/V the target shares (layer 3: sliding, head_dim 32; layer 2: full, head_dim 64; the target's KV
heads), 4 query heads, MLP 256; tied head (the vocabulary is 4,096: an ordered-embeddings head saves little
here). `--layers 1`: one full-attention layer instead (cheaper drafts; measured: as good on prose, worse on chat,
see docs/performance-notes.md).

transformers 5.23 cannot build an assistant config without make_assistant_fixtures.patch_kv_sharing_modes (imported).
"""
import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train_tiny_qat.py: spinning barriers on a shared VM
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_assistant_fixtures as maf  # noqa: E402
import train_tiny_qat as ttq  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "gemma4-tiny-qat"
S, FULL = ttq.S, ttq.FULL
DRAFTS = 4               # chain length trained (k = 1..4 are measured)
PROSE_PROMPT, PROSE_NEW, CHAT_NEW = 32, 160, 64
EOS = ttq.TOP_EOS

ASSISTANT_TEXT = dict(
    vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=1, head_dim=32, global_head_dim=64, layer_types=[S, FULL], sliding_window=64,
    hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, final_logit_softcapping=30.0,
    max_position_embeddings=4096, rope_parameters=ttq.TEXT_CONFIG["rope_parameters"],
    hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
    pad_token_id=0, bos_token_id=2, eos_token_id=1)
BACKBONE = ttq.TEXT_CONFIG["hidden_size"]
LAYER_TYPES = {1: [FULL], 2: [S, FULL]}  # --layers


# --------------------------------------------------------------------------------------------------- models
def load_target():
    from transformers import Gemma4ForConditionalGeneration
    model = Gemma4ForConditionalGeneration.from_pretrained(TARGET, dtype=torch.float32, attn_implementation="sdpa")
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def assistant_text(layers):
    """ASSISTANT_TEXT with --layers' layer types and the target's KV heads (its attention reads the target's K/V)."""
    target_text = json.loads((TARGET / "config.json").read_text())["text_config"]
    return dict(ASSISTANT_TEXT, num_hidden_layers=len(LAYER_TYPES[layers]), layer_types=LAYER_TYPES[layers],
                num_key_value_heads=target_text["num_key_value_heads"])


def build_assistant(layers):
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig
    maf.patch_kv_sharing_modes()
    config = Gemma4AssistantConfig(text_config=Gemma4TextConfig(**assistant_text(layers)), backbone_hidden_size=BACKBONE,
                                   use_ordered_embeddings=False)
    model = Gemma4AssistantForCausalLM(config)
    model.set_attn_implementation("sdpa")
    return model


@torch.no_grad()
def init_from_target(assistant, target):
    """The head is the target's tied embedding; pre_projection starts as 'take the state' (the target's own head on
    its own state predicts the token after the fed one: a fair first guess for draft 1)."""
    emb = target.get_input_embeddings().weight
    assistant.model.embed_tokens.weight.copy_(emb)
    w = assistant.pre_projection.weight           # [H, 2 * backbone]: cat(embedding, state)
    w.zero_()
    w[:, BACKBONE:] = torch.eye(BACKBONE)
    assistant.post_projection.weight.copy_(torch.eye(BACKBONE))


def target_pass(target, rows):
    """Final-normed hidden states [B, L, H], shared K/V {type: (k, v)}, soft-capped logits [B, L, V]."""
    lm = target.model.language_model
    out = lm(input_ids=rows, use_cache=False, return_shared_kv_states=True)
    hidden = out.last_hidden_state
    cap = target.config.get_text_config().final_logit_softcapping
    logits = torch.tanh(target.lm_head(hidden) / cap) * cap
    return hidden, dict(out.shared_kv_states), logits


def draft_masks(Q, window):
    """Query i (the draft after position i, at position i+1) sees the target's K/V at 0..i; sliding: i-W..i (the
    assistant's flipped bidirectional window is inclusive: W + 1 positions, one more than the target's own)."""
    i = torch.arange(Q)[:, None]
    j = torch.arange(Q)[None, :]
    full = j <= i
    # Additive float masks: eager attention adds the mask (a bool one would add 0/1), sdpa takes either.
    additive = lambda allowed: torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None]  # noqa: E731
    return {"full_attention": additive(full), "sliding_attention": additive(full & (j >= i - window))}


def chain_logits(assistant, target, rows, hidden, kv, fed_chain):
    """Drafts 1..len(fed_chain) after every position 0..L-2 of `rows`, all at once. fed_chain[0] = rows[:, 1:] (the
    accepted token), fed_chain[j] the token draft j should have proposed. Returns a list of [B, L-1, V] logits."""
    B, L = rows.shape
    Q = L - 1
    embed = target.get_input_embeddings()
    context = {k: (v[0][:, :, :Q], v[1][:, :, :Q]) for k, v in kv.items()}
    masks = draft_masks(Q, ASSISTANT_TEXT["sliding_window"])
    masks = {k: m.expand(B, 1, Q, Q) for k, m in masks.items()}
    positions = (torch.arange(Q) + 1)[None].expand(B, Q)
    # logits_to_keep not an int: transformers 5.23's slicing before KV-shared layers (every assistant layer is one)
    # indexes the per-layer inputs, which an assistant has none of.
    state = hidden[:, :Q]
    out = []
    for fed in fed_chain:
        x = assistant.pre_projection(torch.cat([embed(fed), state], dim=-1))
        h = assistant.model(inputs_embeds=x, attention_mask=masks, position_ids=positions, shared_kv_states=context,
                            use_cache=False, logits_to_keep=slice(None)).last_hidden_state  # (see below)
        out.append(assistant.lm_head(h))
        state = assistant.post_projection(h)
    return out


# --------------------------------------------------------------------------------------------------- rollouts
def chat_prompts(text):
    """The synthetic chats of `prepare` cut after the model's (empty) thought channel: what the server renders."""
    prompts = []
    for ex in text.split("<bos>")[1:]:
        cut = ex.rfind("<channel|>")
        if cut > 0:
            prompts.append("<bos>" + ex[:cut + len("<channel|>")])
    return prompts


@torch.no_grad()
def greedy(target, prompts, new, stop):
    """Greedy continuation of equal-length prompts [B, P] with transformers' generate; rows end at a stop id (kept)
    and are padded with -1 after it."""
    out = target.generate(prompts, max_new_tokens=new, do_sample=False, eos_token_id=stop if stop else None,
                          pad_token_id=0, min_new_tokens=0)
    rows = []
    for r in out.tolist():
        gen = r[prompts.shape[1]:]
        if stop:
            ends = [i for i, t in enumerate(gen) if t in stop]
            gen = gen[:ends[0] + 1] if ends else gen
        rows.append(r[:prompts.shape[1]] + gen)
    return rows


def rollouts(args):
    torch.set_num_threads(args.threads)
    work = args.work
    data = torch.load(work / "tokens.pt")
    tok = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    target = load_target()
    rng = random.Random(20261202)
    prose = data["prose"].long()
    chats = chat_prompts((work / "chats.txt").read_text())
    by_len = {}
    for c in chats:
        ids = tok.encode(c, add_special_tokens=False).ids
        by_len.setdefault(len(ids), []).append(ids)
    buckets = [v for v in by_len.values() if len(v) >= args.batch]
    records, t0, n_tokens = [], time.time(), 0
    path = work / "rollouts.pt"
    while n_tokens < args.tokens:
        if rng.random() < args.chat_share:
            bucket = rng.choice(buckets)
            prompts = torch.tensor(rng.sample(bucket, args.batch))
            new, stop = CHAT_NEW, EOS
        else:
            starts = [rng.randrange(len(prose) - PROSE_PROMPT) for _ in range(args.batch)]
            prompts = torch.stack([torch.cat([torch.tensor([2]), prose[s:s + PROSE_PROMPT - 1]]) for s in starts])
            new, stop = PROSE_NEW, []
        for row in greedy(target, prompts, new, stop):
            records.append({"ids": torch.tensor(row, dtype=torch.int16), "prompt": prompts.shape[1]})
            n_tokens += len(row) - prompts.shape[1]
        print(json.dumps(dict(rows=len(records), generated=n_tokens, elapsed=round(time.time() - t0, 1))),
              flush=True)
        torch.save(records, path)
    print(f"rollouts: {len(records)} rows, {n_tokens} generated tokens in {time.time() - t0:.0f} s -> {path}")


# --------------------------------------------------------------------------------------------------- training
def batch_of(records, idx):
    """Rows padded with 0 to the longest; lengths and prompt lengths."""
    rows = [records[i]["ids"].long() for i in idx]
    L = max(len(r) for r in rows)
    x = torch.zeros(len(rows), L, dtype=torch.long)
    for b, r in enumerate(rows):
        x[b, :len(r)] = r
    return x, torch.tensor([len(r) for r in rows]), torch.tensor([records[i]["prompt"] for i in idx])


def chain_labels(greedy_next, lengths, prompts, drafts):
    """For draft j (1-based) after position t: the target's greedy pick at t+j (the token at t+j+1), valid when t+j
    is inside the row and, for j > 1, the tokens t+2..t+j are the target's greedy text (t + 2 >= prompt length).
    greedy_next [B, L]: argmax of the logits at each position. Returns [(labels [B, L-1], mask [B, L-1])]."""
    B, L = greedy_next.shape
    t = torch.arange(L - 1)[None]
    out = []
    for j in range(1, drafts + 1):
        labels = torch.zeros(B, L - 1, dtype=torch.long)
        src = greedy_next[:, j:]                                   # position t + j for t = 0..L-1-j
        labels[:, : src.shape[1]] = src
        mask = (t + j <= lengths[:, None] - 1) & (t + 1 <= lengths[:, None] - 1)
        if j > 1:
            mask &= t + 2 >= prompts[:, None]
        out.append((labels, mask))
    return out


def draft_losses(assistant, target, rows, lengths, prompts, drafts):
    with torch.no_grad():
        hidden, kv, logits = target_pass(target, rows)
        greedy_next = logits.argmax(-1)
    labels = chain_labels(greedy_next, lengths, prompts, drafts)
    fed = [rows[:, 1:]] + [lab for lab, _ in labels[:-1]]
    out = chain_logits(assistant, target, rows, hidden, kv, fed)
    losses, accs = [], []
    for j, (lg, (lab, mask)) in enumerate(zip(out, labels), start=1):
        teacher = F.log_softmax(logits[:, j:j + lg.shape[1]], -1)
        n = teacher.shape[1]
        m = mask[:, :n].float()
        logp = F.log_softmax(lg[:, :n].float(), -1)
        ce = -logp.gather(-1, lab[:, :n, None])[..., 0]
        kl = (teacher.exp() * (teacher - logp)).sum(-1)
        losses.append(((ce + kl) * m).sum() / m.sum().clamp_min(1))
        accs.append(float(((lg[:, :n].argmax(-1) == lab[:, :n]).float() * m).sum() / m.sum().clamp_min(1)))
    return losses, accs


def split_records(records, held_share=0.05):
    rng = random.Random(3)
    idx = list(range(len(records)))
    rng.shuffle(idx)
    n = max(8, int(len(idx) * held_share))
    return idx[n:], idx[:n]


def evaluate(assistant, target, records, idx, batch):
    assistant.eval()
    sums = [0.0] * DRAFTS
    with torch.no_grad():
        for i in range(0, len(idx), batch):
            _, accs = draft_losses(assistant, target, *batch_of(records, idx[i:i + batch]), DRAFTS)
            sums = [s + a for s, a in zip(sums, accs)]
    assistant.train()
    n = math.ceil(len(idx) / batch)
    return [round(s / n, 4) for s in sums]


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    work = args.work
    records = torch.load(work / "rollouts.pt")
    train_idx, val_idx = split_records(records)
    target = load_target()
    assistant = build_assistant(args.layers)
    init_from_target(assistant, target)
    ttq.install_qat(assistant)
    print(f"assistant parameters {sum(p.numel() for p in assistant.parameters())}; rollouts {len(records)} rows",
          flush=True)
    decay = [p for n, p in assistant.named_parameters() if p.dim() >= 2]
    other = [p for n, p in assistant.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    rng = random.Random(11)
    log = open(work / f"assistant-{args.layers}l_log.jsonl", "w")
    budget, t0, step, order = args.minutes * 60, time.time(), 0, []
    assistant.train()
    while time.time() - t0 < budget:
        progress = (time.time() - t0) / budget
        ttq.QAT.enabled = progress >= 1 - args.qat_fraction
        for g in opt.param_groups:
            g["lr"] = ttq.lr_at(progress, args.lr, args.warmup)
        if len(order) < args.batch:
            order = train_idx[:]
            rng.shuffle(order)
        idx, order = order[:args.batch], order[args.batch:]
        losses, accs = draft_losses(assistant, target, *batch_of(records, idx), DRAFTS)
        loss = sum(losses)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(assistant.parameters(), 1.0)
        opt.step()
        step += 1
        rec = dict(step=step, loss=round(loss.item(), 4), draft_loss=[round(x.item(), 3) for x in losses],
                   draft_acc=[round(a, 3) for a in accs], lr=opt.param_groups[0]["lr"], qat=ttq.QAT.enabled,
                   elapsed=round(time.time() - t0, 1))
        if step % args.eval_every == 0:
            rec["val_acc"] = evaluate(assistant, target, records, val_idx, args.batch)
            torch.save({"model": assistant.state_dict(), "step": step}, work / f"assistant-{args.layers}l.pt")
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if step % 10 == 0 or "val_acc" in rec:
            print(json.dumps(rec), flush=True)
    ttq.QAT.enabled = True
    rec = dict(step=step, val_acc=evaluate(assistant, target, records, val_idx, args.batch), qat=True,
               elapsed=round(time.time() - t0, 1), final=True)
    log.write(json.dumps(rec) + "\n")
    torch.save({"model": assistant.state_dict(), "step": step}, work / f"assistant-{args.layers}l.pt")
    print(json.dumps(rec), flush=True)


# --------------------------------------------------------------------------------------------------- export
def export(args):
    """The trained drafter on the int4 grid in bf16 (as Google's -qat-q4_0-unquantized files), a Google-style config,
    the training log and loss curve; then checks it as a user loads it (transformers, float32, from the directory):
    the batched training forward equals transformers' own drafting step on a held-out row."""
    import shutil
    out = args.out
    assistant = build_assistant(args.layers)
    assistant.load_state_dict(torch.load(args.work / f"assistant-{args.layers}l.pt")["model"])
    with torch.no_grad():
        for name, module in assistant.named_modules():
            if (isinstance(module, torch.nn.Linear) and module.in_features % ttq.GROUP == 0 and
                    name != "lm_head") or name.endswith(".embed_tokens"):
                module.weight.copy_(ttq.grid_value(module.weight).float())
    if out.exists():
        shutil.rmtree(out)
    assistant.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    saved = json.loads((out / "config.json").read_text())
    maf.g4_config.write_json(out / "config.json", maf.google_style_assistant_config(saved, {"text": assistant_text(args.layers)}))
    shutil.copyfile(TARGET / "generation_config.json", out / "generation_config.json")
    shutil.copyfile(args.work / f"assistant-{args.layers}l_log.jsonl", out / "train_log.jsonl")
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    ttq.loss_png(rows, out / "loss.png")

    target = load_target()
    loaded = maf.load_assistant(out, torch.float32)
    tok = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    held = tok.encode((TARGET / "held_out.txt").read_text(), add_special_tokens=False).ids
    tokens = torch.tensor([2] + held[:95])
    worst = check_batched_forward(target, loaded, tokens)
    final = rows[-1]
    summary = dict(steps=final["step"], train_seconds=final["elapsed"], rollout_rows=len(torch.load(
        args.work / "rollouts.pt")), val_chain_accuracy=final["val_acc"],
        parameters=sum(p.numel() for p in loaded.parameters()),
        batched_forward_vs_transformers_max_rel_diff=worst)
    (out / "export_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


@torch.no_grad()
def check_batched_forward(target, assistant, tokens):
    """The chain as trained (all positions at once, chain_logits) against make_assistant_fixtures.draft_chains
    (transformers' drafting step one position at a time): the same logits, past the sliding window too."""
    chain, ids, _, _ = maf.draft_chains(target, assistant, tokens)
    rows = tokens[None].long()
    hidden, kv, _ = target_pass(target, rows)
    fed = [rows[:, 1:]] + [ids[:-1, j - 1][None].long() for j in range(1, DRAFTS)]
    out = chain_logits(assistant, target, rows, hidden, kv, fed)
    worst = max(float(((out[j][0] - chain[:-1, j]).abs().amax(-1) / chain[:-1, j].abs().amax(-1)).max())
                for j in range(DRAFTS))
    if worst > 1e-4:
        raise SystemExit(f"the batched training forward differs from transformers' drafting step: {worst:.3g}")
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rollouts")
    r.add_argument("--work", type=Path, default=REPO / "out" / "train")
    r.add_argument("--tokens", type=int, default=250_000, help="greedy tokens to generate")
    r.add_argument("--batch", type=int, default=64, help="prompts generated at once (of equal length)")
    r.add_argument("--chat-share", type=float, default=0.3)
    r.add_argument("--threads", type=int, default=2)
    t = sub.add_parser("train")
    t.add_argument("--work", type=Path, default=REPO / "out" / "train")
    t.add_argument("--minutes", type=float, default=25, help="wall-clock budget; the schedule follows it")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=float, default=0.03)
    t.add_argument("--qat-fraction", type=float, default=0.4, help="the last fraction of the budget runs QAT")
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--layers", type=int, choices=sorted(LAYER_TYPES), default=2)
    e = sub.add_parser("export")
    e.add_argument("--layers", type=int, choices=sorted(LAYER_TYPES), default=2)
    e.add_argument("--work", type=Path, default=REPO / "out" / "train")
    e.add_argument("--out", type=Path, default=REPO / "models" / "gemma4-tiny-qat-assistant")
    args = ap.parse_args()
    {"rollouts": rollouts, "train": train, "export": export}[args.cmd](args)


if __name__ == "__main__":
    main()
