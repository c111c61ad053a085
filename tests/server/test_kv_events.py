#!/usr/bin/env python3
"""KV events (`serve --kv-events-endpoint`) followed by a subscriber, as llm-d's KV-cache indexer follows vLLM.

usage: test_kv_events.py QATSERVE_BINARY

The demo model serves with a KV pool of a few prompts' blocks (so that later prompts evict earlier ones), KV events
on an ipc:// PUB socket with a topic, and a replay socket. The subscriber (pyzmq) connects before the server starts:
- frames: [topic, 8-byte big-endian sequence number, payload], numbers consecutive from 0; a batch it joined too late
  for is fetched from the replay socket, and at the end the replay socket gives every batch again, byte for byte,
  then its end marker (-1);
- payload: decoded with msgspec against vLLM's own event types (array_like, tagged: KVEventBatch of BlockStored,
  BlockRemoved, AllBlocksCleared, as vllm/distributed/kv_events.py declares them), and with plain msgpack;
- block hashes: every stored block's hash equals vLLM's sha256_cbor hash (hashlib.sha256(cbor2.dumps((parent,
  tokens, None), canonical=True)), NONE_HASH = sha256(cbor2.dumps("vllm-none-hash")), the low 64 bits as the
  integer), computed here from the token ids the prompts were sent as; its token_ids are those blocks' tokens and
  its parent the block before;
- the block set rebuilt from AllBlocksCleared / BlockStored / BlockRemoved (never removing a block it does not hold)
  equals the server's own (GET /debug/kv_blocks) after the run, with blocks removed on the way (eviction);
- a prompt sent again, after its blocks were evicted, is stored again under the same hashes.
Counters and sets only; no wall time is asserted.
Exit status: 0 all passed, 1 a check failed, 77 skipped (no pyzmq / msgpack / msgspec / cbor2 in .venv).
"""
import hashlib
import os
import sys
import time
from pathlib import Path

from server_harness import SKIP, Checks, Server, wait_for, run_suite_main  # noqa: E402

try:
    import cbor2
    import msgpack
    import msgspec
    import zmq
except ImportError as e:
    print(f"kv events test skipped: {e.name} is not installed (pip install -r tools/python/requirements.txt)")
    sys.exit(SKIP)

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma4-tiny-qat"
TEXT = (ROOT / "models" / "gemma4-tiny-qat" / "held_out.txt").read_text()
BLOCK = 16
TOPIC = b"kv"


# vLLM's event types (vllm/distributed/kv_events.py, the array form of vLLM 0.10 and 0.11).
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def sha256_cbor(value):  # vllm.utils.hashing.sha256_cbor
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


NONE_HASH = sha256_cbor("vllm-none-hash")  # vLLM's init_none_hash without PYTHONHASHSEED


def block_hashes(tokens):
    """vLLM's hash_block_tokens chain over the complete blocks of `tokens`: [(int hash, digest, block tokens)]."""
    chain, parent = [], NONE_HASH
    for i in range(len(tokens) // BLOCK):
        block = tokens[i * BLOCK:(i + 1) * BLOCK]
        digest = sha256_cbor((parent, tuple(block), None))
        chain.append((int.from_bytes(digest, "big") & ((1 << 64) - 1), digest, block))
        parent = digest
    return chain


class Subscriber:
    """Follows the PUB socket (and the replay socket for what it missed) and rebuilds the block set."""

    def __init__(self, endpoint, replay):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self.replay_endpoint = replay
        self.next_seq = 0
        self.blocks = set()
        self.stored, self.removed, self.cleared, self.replayed = [], [], 0, 0
        self.payloads = []

    def apply(self, seq, payload):
        assert seq == self.next_seq, (seq, self.next_seq)
        self.next_seq += 1
        self.payloads.append(payload)
        batch = DECODER.decode(payload)
        plain = msgpack.unpackb(payload)  # the same bytes through a plain msgpack decoder
        assert len(plain) == 3 and plain[2] == 0 and batch.data_parallel_rank == 0, plain
        assert abs(batch.ts - time.time()) < 3600, batch.ts
        for e in batch.events:
            if isinstance(e, AllBlocksCleared):
                self.blocks.clear()
                self.cleared += 1
            elif isinstance(e, BlockStored):
                assert e.block_size == BLOCK and e.medium == "GPU" and e.lora_id is None, e
                assert len(e.token_ids) == BLOCK * len(e.block_hashes), e
                self.blocks.update(e.block_hashes)
                self.stored.append(e)
            else:
                assert e.medium == "GPU", e
                missing = set(e.block_hashes) - self.blocks
                assert not missing, f"removed blocks never stored: {missing}"
                self.blocks.difference_update(e.block_hashes)
                self.removed.append(e)

    def fetch_replay(self, start):
        # A DEALER with REQ's empty delimiter frame: the ROUTER streams many replies to one request.
        req = self.ctx.socket(zmq.DEALER)
        req.connect(self.replay_endpoint)
        req.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        while True:
            assert req.poll(60000), "no answer from the replay socket"
            empty, seq_bytes, payload = req.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == -1:
                assert empty == b"" and payload == b"", (empty, payload)
                break
            got.append((seq, payload))
        req.close(linger=0)
        return got

    def poll(self, timeout_ms):
        """Applies every message that arrives within timeout_ms of the last; returns how many."""
        n = 0
        while self.sub.poll(timeout_ms):
            topic, seq_bytes, payload = self.sub.recv_multipart()
            assert topic == TOPIC, topic
            seq = int.from_bytes(seq_bytes, "big")
            if seq > self.next_seq:  # joined late or missed some: ask the replay socket
                for s, p in self.fetch_replay(self.next_seq):
                    if s < seq:
                        self.apply(s, p)
                        self.replayed += 1
            if seq < self.next_seq:
                continue
            self.apply(seq, payload)
            n += 1
        return n


class KvEventsSuite(Checks):
    def __init__(self, binary, workdir):
        super().__init__()
        self.binary, self.workdir = binary, Path(workdir)
        self.server = None

    def run_events(self):
        endpoint = f"ipc://{self.workdir}/kv-events"
        replay = f"ipc://{self.workdir}/kv-replay"
        sub = Subscriber(endpoint, replay)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
        self.server = Server(self.binary, MODEL, self.workdir, "kv-events", "--precision", "f32", "--max-running", "1",
                             "--kv-memory", "400K", "--kv-events-endpoint", endpoint, "--kv-events-topic", "kv",
                             "--kv-events-replay-endpoint", replay, env=env)
        s = self.server
        s.wait_ready()
        status, info = s.json("GET", "/debug/kv_blocks")
        assert status == 200 and info["block_size"] == BLOCK, info
        pool_blocks = info["num_blocks"]

        expected = {}  # int hash -> (digest, parent int or None, tokens)
        prompts = []
        for i in range(6):  # distinct prompts, each about a third of the pool: later ones evict earlier ones
            status, tok = s.json("POST", "/tokenize", {"prompt": TEXT[i * 1500:i * 1500 + 1200]})
            assert status == 200, tok
            ids = tok["tokens"][: pool_blocks * BLOCK // 3]
            prompts.append(ids)
        for ids in prompts + [prompts[0]]:  # the first again, after its blocks were evicted
            status, body = s.json("POST", "/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0})
            assert status == 200, body
            parent = None
            for h, digest, block in block_hashes(ids):
                expected[h] = (parent, block)
                parent = h
            sub.poll(200)

        def settled():
            sub.poll(300)
            status, info = s.json("GET", "/debug/kv_blocks")
            return info if set(info["block_hashes"]) == sub.blocks else None

        info = wait_for(settled, "the subscriber's block set to equal /debug/kv_blocks")
        assert info["batches_dropped"] == 0, info
        assert sub.cleared >= 1, "no AllBlocksCleared at start"
        assert sub.removed, "no BlockRemoved: the pool never evicted"
        stored = [(h, i, e) for e in sub.stored for i, h in enumerate(e.block_hashes)]
        for h, i, e in stored:
            assert h in expected, f"stored block {h:#x} is not a block of any prompt as vLLM hashes it"
            parent, block = expected[h]
            assert e.token_ids[i * BLOCK:(i + 1) * BLOCK] == block, (h, e)
            assert (e.block_hashes[i - 1] if i else e.parent_block_hash) == parent, (h, e)
        first = [h for h, _, _ in block_hashes(prompts[0])]
        times_stored = {h: sum(1 for x, _, _ in stored if x == h) for h in first}
        assert all(n >= 2 for n in times_stored.values()), f"the first prompt's blocks were not stored again: {times_stored}"
        assert set(first) <= sub.blocks, "the first prompt's blocks are not held after it ran again"
        replayed = sub.fetch_replay(0)  # everything again, as published
        assert [seq for seq, _ in replayed] == list(range(sub.next_seq)), [seq for seq, _ in replayed]
        assert [p for _, p in replayed] == sub.payloads
        print(f"  {len(sub.stored)} BlockStored, {len(sub.removed)} BlockRemoved, {sub.cleared} AllBlocksCleared, "
              f"{sub.next_seq} batches ({sub.replayed} from replay), {len(sub.blocks)} blocks held of {pool_blocks}")
        s.stop()

    def run(self):
        self.check("kv_events_follow_the_prefix_cache", self.run_events)
        return self.summary("kv events", self.server)


def main():
    return run_suite_main(__doc__, KvEventsSuite, "qatserve-kv-events-")


if __name__ == "__main__":
    sys.exit(main())
