#pragma once
// Publishes KV events (model/kv_events.h) as vLLM's ZmqEventPublisher does (vllm/distributed/kv_events.py), for
// llm-d's KV-cache indexer and any other consumer of vLLM's stream:
//   a ZeroMQ PUB socket (`--kv-events-endpoint`; bound when the address has a `*`, `::`, or is ipc:// or inproc://,
//   else connected), each batch one three-frame message: topic (`--kv-events-topic`, default empty), sequence number
//   (8 bytes, big-endian, from 0), payload;
//   the payload, msgpack of vLLM's array form (msgspec array_like, as vLLM 0.10 and 0.11 encode KVEventBatch):
//     [ts (float, seconds since the epoch), [event...], data_parallel_rank (0)]
//     ["BlockStored", [hash...], parent hash or nil, [token id...], block_size, lora_id (nil), medium ("GPU")]
//     ["BlockRemoved", [hash...], medium ("GPU")]
//     ["AllBlocksCleared"]
//   an optional ROUTER socket (`--kv-events-replay-endpoint`) answering a request [identity, "", start sequence
//   (8 bytes big-endian)] with every buffered batch from there ([identity, "", seq, payload] each) and an end
//   marker [identity, "", -1 (8 bytes, signed), ""].
// The engine never waits for it: publish() queues the batch for the publisher's own thread, or drops it when
// --kv-events-queue batches already wait (counted: dropped()); the PUB socket itself drops a message for a
// subscriber more than its high-water mark behind (ZeroMQ's rule). A consumer that sees a gap in the sequence
// numbers asks the replay socket for what it missed.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "model/kv_events.h"
#include "server/json_response.h"

namespace qs {

struct KvEventsOptions {
  std::string endpoint;         // PUB address, e.g. tcp://*:5557
  std::string replay_endpoint;  // ROUTER address; empty: none
  std::string topic;
  int64_t block_size = 16;
  int high_water_mark = 100000;  // ZeroMQ's send high-water mark of the PUB socket, in messages
  size_t max_queue = 10000;      // batches waiting for the publisher thread; a batch past it is dropped
  size_t replay_batches = 10000; // batches kept for replay
};

// The msgpack payload of one batch (the form above).
std::string encode_kv_event_batch(double ts, const std::vector<KvEvent>& events, int64_t block_size);

class KvEventsPublisher {
 public:
  // Opens the sockets; throws naming the endpoint when ZeroMQ refuses it.
  explicit KvEventsPublisher(KvEventsOptions options);
  ~KvEventsPublisher();  // sends what is queued, then closes
  KvEventsPublisher(const KvEventsPublisher&) = delete;
  KvEventsPublisher& operator=(const KvEventsPublisher&) = delete;

  // Queues one batch, stamped now; never blocks on the network.
  void publish(std::vector<KvEvent> events);
  uint64_t published() const { return published_.load(); }  // batches sent
  uint64_t dropped() const { return dropped_.load(); }      // batches dropped: the queue was full

 private:
  struct Sockets;
  void run();

  KvEventsOptions options_;
  std::unique_ptr<Sockets> sockets_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::pair<double, std::vector<KvEvent>>> queue_;
  bool stopping_ = false;
  std::atomic<uint64_t> published_{0}, dropped_{0};
  std::thread thread_;
};

// Opens the publisher of `options` (none when its endpoint is empty) and routes the engine's events to it.
std::unique_ptr<KvEventsPublisher> connect_kv_events(EngineOptions& engine, const KvEventsOptions& options,
                                                     const std::string& hash_seed);

// GET /debug/kv_blocks: {"block_size", "num_blocks" (of the reported class), "block_hashes" (ascending: the vLLM
// hashes the prefix cache holds, Engine::kv_block_hashes), "batches_published", "batches_dropped"}; 404 without
// --kv-events-endpoint.
HttpResponse kv_blocks_response(const Engine& engine, const KvEventsPublisher* publisher);

}  // namespace qs
