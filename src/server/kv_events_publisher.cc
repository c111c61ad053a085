#include "server/kv_events_publisher.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "server/openai_protocol.h"
#include "util/error.h"

namespace qs {
namespace {

constexpr const char* kMedium = "GPU";  // vLLM's name for the engine's own KV pool

void pack_text(msgpack::packer<msgpack::sbuffer>& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void pack_hashes(msgpack::packer<msgpack::sbuffer>& pk, const std::vector<uint64_t>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (uint64_t h : hashes) pk.pack_uint64(h);
}

void pack_event(msgpack::packer<msgpack::sbuffer>& pk, const KvEvent& e, int64_t block_size) {
  switch (e.kind) {
    case KvEvent::Kind::BlockStored:
      pk.pack_array(7);
      pack_text(pk, "BlockStored");
      pack_hashes(pk, e.block_hashes);
      if (e.parent_block_hash) pk.pack_uint64(*e.parent_block_hash);
      else pk.pack_nil();
      pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
      for (int32_t t : e.token_ids) pk.pack_int32(t);
      pk.pack_int64(block_size);
      pk.pack_nil();  // lora_id: adapters are told apart by their hashes (kv_events.h)
      pack_text(pk, kMedium);
      return;
    case KvEvent::Kind::BlockRemoved:
      pk.pack_array(3);
      pack_text(pk, "BlockRemoved");
      pack_hashes(pk, e.block_hashes);
      pack_text(pk, kMedium);
      return;
    case KvEvent::Kind::AllBlocksCleared:
      pk.pack_array(1);
      pack_text(pk, "AllBlocksCleared");
      return;
  }
}

std::string big_endian(int64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * (7 - i)));
  return s;
}

bool binds(const std::string& endpoint) {  // vLLM's rule: bind a stable address, connect to a volatile one
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

}  // namespace

std::string encode_kv_event_batch(double ts, const std::vector<KvEvent>& events, int64_t block_size) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(&buffer);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) pack_event(pk, e, block_size);
  pk.pack_int(0);  // data_parallel_rank: one engine per process
  return std::string(buffer.data(), buffer.size());
}

struct KvEventsPublisher::Sockets {
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
  std::deque<std::pair<int64_t, std::string>> buffer;  // (seq, payload) for replay
  int64_t next_seq = 0;
};

KvEventsPublisher::KvEventsPublisher(KvEventsOptions options)
    : options_(std::move(options)), sockets_(std::make_unique<Sockets>()) {
  Sockets& s = *sockets_;
  try {
    s.pub.set(zmq::sockopt::sndhwm, options_.high_water_mark);
    s.pub.set(zmq::sockopt::linger, 1000);
    if (binds(options_.endpoint)) s.pub.bind(options_.endpoint);
    else s.pub.connect(options_.endpoint);
  } catch (const zmq::error_t& e) {
    throw Error(fmt::format("--kv-events-endpoint {}: {}", options_.endpoint, e.what()));
  }
  if (!options_.replay_endpoint.empty()) {
    try {
      s.replay.emplace(s.context, zmq::socket_type::router);
      s.replay->set(zmq::sockopt::linger, 0);
      s.replay->bind(options_.replay_endpoint);
    } catch (const zmq::error_t& e) {
      throw Error(fmt::format("--kv-events-replay-endpoint {}: {}", options_.replay_endpoint, e.what()));
    }
  }
  thread_ = std::thread([this] { run(); });
}

KvEventsPublisher::~KvEventsPublisher() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void KvEventsPublisher::publish(std::vector<KvEvent> events) {
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= options_.max_queue) {
      ++dropped_;
      return;
    }
    queue_.emplace_back(ts, std::move(events));
  }
  wake_.notify_one();
}

void KvEventsPublisher::run() {
  Sockets& s = *sockets_;
  auto send = [](zmq::socket_t& socket, std::initializer_list<std::string_view> frames) {
    size_t i = 0;
    for (std::string_view f : frames) {
      const auto more = ++i < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      (void)socket.send(zmq::buffer(f.data(), f.size()), more | zmq::send_flags::dontwait);
    }
  };
  auto serve_replays = [&] {
    zmq::pollitem_t item{s.replay->handle(), 0, ZMQ_POLLIN, 0};
    while (zmq::poll(&item, 1, std::chrono::milliseconds(0)) > 0) {
      std::vector<zmq::message_t> frames;
      (void)zmq::recv_multipart(*s.replay, std::back_inserter(frames));
      if (frames.size() != 3 || frames[2].size() != 8) continue;  // not a replay request
      int64_t start = 0;
      for (uint8_t b : std::string_view(frames[2].data<char>(), 8)) start = (start << 8) | b;
      const std::string id = frames[0].to_string();
      for (const auto& [seq, payload] : s.buffer)
        if (seq >= start) send(*s.replay, {id, "", big_endian(seq), payload});
      send(*s.replay, {id, "", big_endian(-1), ""});
    }
  };
  while (true) {
    std::deque<std::pair<double, std::vector<KvEvent>>> batches;
    bool stop;
    {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stopping_ || !queue_.empty(); });
      batches.swap(queue_);
      stop = stopping_;
    }
    for (const auto& [ts, events] : batches) {
      std::string payload = encode_kv_event_batch(ts, events, options_.block_size);
      const int64_t seq = s.next_seq++;
      send(s.pub, {options_.topic, big_endian(seq), payload});
      ++published_;
      s.buffer.emplace_back(seq, std::move(payload));
      if (s.buffer.size() > options_.replay_batches) s.buffer.pop_front();
    }
    if (s.replay) serve_replays();
    if (stop) return;
  }
}

}  // namespace qs

namespace qs {

std::unique_ptr<KvEventsPublisher> connect_kv_events(EngineOptions& engine, const KvEventsOptions& options,
                                                     const std::string& hash_seed) {
  if (options.endpoint.empty()) return nullptr;
  KvEventsOptions o = options;
  o.block_size = engine.kv_block_size;
  auto publisher = std::make_unique<KvEventsPublisher>(std::move(o));
  engine.kv_events = [p = publisher.get()](std::vector<KvEvent> events) { p->publish(std::move(events)); };
  engine.kv_events_hash_seed = hash_seed;
  return publisher;
}

HttpResponse kv_blocks_response(const Engine& engine, const KvEventsPublisher* publisher) {
  if (!publisher) throw ApiError(404, "no KV events: serve was started without --kv-events-endpoint", "",
                                 "invalid_request_error");
  std::vector<uint64_t> hashes = engine.kv_block_hashes();
  std::sort(hashes.begin(), hashes.end());
  return json_response(200, {{"block_size", engine.kv_block_size()},
                             {"num_blocks", engine.kv_blocks_total()},
                             {"block_hashes", hashes},
                             {"batches_published", publisher->published()},
                             {"batches_dropped", publisher->dropped()}});
}

}  // namespace qs
