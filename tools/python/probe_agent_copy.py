#!/usr/bin/env python3
"""probe_agent_copy.py: how fast a demo-model shape learns to copy values, in minutes instead of train_tiny_agent.py's
hours. Trains from random weights (float, no QAT) on one narrow task and prints the held-out score every
--eval-every steps:

  json        agent_data's JSON extraction examples only (short prompts, every answer a copy of the request's
              values); the score is held-out examples whose whole answer is the argmax under teacher forcing
              (what greedy decoding writes), and the share of answer tokens right
  induction   rows of [random tokens][random filler][the same tokens again], scored on the repeat: copying with
              nothing else to learn from

    .venv/bin/python tools/python/probe_agent_copy.py json --shape '{"num_key_value_heads": 4}' --qk-norm-init 0.42

Uses out/train-bare's tokenizer (train_tiny_qat.py prepare --bare-words). One thread by default, so that two
variants run side by side on two cores. Results: train_tiny_agent.py's docstring. With `--save`, the json task is
the first stage of train_tiny_agent.py's recipe: a model that copies, which the agent mix then starts from.
"""
import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agent_tools  # noqa: E402
import train_tiny_qat as base  # noqa: E402
from agent_data import HELD_OUT, TRAIN, AgentExamples  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def json_examples(args, tok, split, seed, count):
    """(ids, prompt length) of agent_data's JSON examples that fit a row."""
    gen = AgentExamples(args.base_work / "tokenizer" / "chat_template.jinja", split, seed)
    gen.MIX = (("json", 1.0),)
    out = []
    for _ in range(count):
        e = gen.sample()
        p = tok.encode(e.prompt, add_special_tokens=False).ids
        t = tok.encode(e.target, add_special_tokens=False).ids
        if len(p) + len(t) <= args.context:
            out.append((p + t, len(p)))
    return out


def packed(args, rng, unit):
    """(rows, context + 1) ids and the mask of scored positions, rows packed with unit() -> (ids, scored flags)."""
    rows, masks = [], []
    for _ in range(args.rows):
        ids, mask = [], []
        while len(ids) < args.context + 1:
            x, m = unit()
            ids += x
            mask += m
        rows.append(torch.tensor(ids[:args.context + 1]))
        masks.append(torch.tensor(mask[:args.context + 1], dtype=torch.bool))
    return torch.stack(rows), torch.stack(masks)


def induction_unit(rng, vocab):
    seg = [rng.randrange(300, vocab) for _ in range(rng.randint(4, 16))]
    filler = [rng.randrange(300, vocab) for _ in range(rng.randint(0, 40))]
    return seg + filler + seg, [0] * (len(seg) + len(filler) + 1) + [1] * (len(seg) - 1)


@torch.no_grad()
def held_out_score(model, held):
    model.eval()
    exact = right = total = 0
    for ids, p in held:
        x = torch.tensor([ids])
        pred = model(input_ids=x[:, :-1]).logits[0, p - 1:].argmax(-1)
        ok = pred == x[0, p:]
        exact += int(ok.all())
        right += ok.sum().item()
        total += len(ok)
    model.train()
    return f"{exact}/{len(held)}", round(right / total, 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task", choices=["json", "induction"])
    ap.add_argument("--base-work", type=Path, default=REPO / "out" / "train-bare")
    ap.add_argument("--shape", default="{}", help="changes to train_tiny_qat.TEXT_CONFIG")
    ap.add_argument("--qk-norm-init", type=float)
    ap.add_argument("--piece-names", action="store_true", help="invented names from the tokenizer's pieces")
    ap.add_argument("--invented-share", type=float, default=0.9)
    ap.add_argument("--examples", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save", type=Path, help="write the weights here at every evaluation, as train_tiny_agent.py "
                                              "train --start reads them (the first stage of its recipe)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    rng = random.Random(3)
    tok = Tokenizer.from_file(str(args.base_work / "tokenizer" / "tokenizer.json"))
    config = {**base.TEXT_CONFIG, **json.loads(args.shape)}
    if args.task == "json":
        agent_tools.INVENTED_SHARE = {"city": args.invented_share, "person": args.invented_share}
        if args.piece_names:
            agent_tools.use_pieces(tok.get_vocab())
        train = json_examples(args, tok, TRAIN, 5, args.examples)
        held = json_examples(args, tok, HELD_OUT, 7, 150)

        def unit():
            ids, p = train[rng.randrange(len(train))]
            return ids, [0] * p + [1] * (len(ids) - p)
    else:
        def unit():
            return induction_unit(rng, config["vocab_size"])
    model = base.build_model(config, args.qk_norm_init)
    opt = base.make_optimizer(model, args.lr)
    t0, accs = time.time(), []
    for step in range(1, args.steps + 1):
        for g in opt.param_groups:
            g["lr"] = base.lr_at(step / args.steps, args.lr, 0.03)
        x, mask = packed(args, rng, unit)
        logits = model(input_ids=x[:, :-1]).logits[mask[:, 1:]]
        targets = x[:, 1:][mask[:, 1:]]
        loss = F.cross_entropy(logits, targets)
        accs.append((logits.argmax(-1) == targets).float().mean().item())
        base.optimizer_step(model, opt, loss)
        if step % args.eval_every == 0 or step == args.steps:
            rec = dict(step=step, loss=round(loss.item(), 3), train_token_acc=round(sum(accs) / len(accs), 3),
                       seconds=round(time.time() - t0))
            accs = []
            if args.task == "json":
                rec["held_out_exact"], rec["held_out_token_acc"] = held_out_score(model, held)
            print(json.dumps(rec), flush=True)
            if args.save:
                torch.save({"model": model.state_dict(), "step": step}, args.save)


if __name__ == "__main__":
    main()
