#include "comm_backends/ps/ps_backend.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include "comm_backends/collective/kv_store.h"

namespace commsched {
namespace {
using namespace ps;
using control::payload_text;

// The gradients of the frameworks' optimizers (torch DistributedOptimizer, TensorFlow's tape and Keras): the only
// push_pulls an async or ssp run answers with running sums. Every other push_pull (a metric, a loss average) stays
// one synchronous round of every worker, as its callers expect.
bool is_gradient(std::string_view name) { return name.starts_with("grad.") || name.starts_with("keras.grad."); }
}  // namespace

PsBackend::PsBackend(const ClusterEnv& env, const PsConfig& cfg)
    : env_(env), cfg_(cfg), lags_(static_cast<size_t>(std::max(1, env.num_servers))) {
  env_.validate();
  cfg_.validate(env_.timeout_s);
  if (env_.role != Role::worker) throw InvalidArgument("PsBackend needs COMMSCHED_ROLE=worker");
  if (env_.num_servers < 1) throw InvalidArgument("COMMSCHED_NUM_SERVERS must be at least 1 for the parameter server");
  caps_ = make_capabilities();
  transport_ = make_transport(cfg_.transport, cfg_.transport_options(env_));
  rendezvous_ = cfg_.rendezvous(env_);
  van_ = std::make_unique<control::Van>(cfg_.van_options(env_, *rendezvous_), *transport_,
                                        static_cast<control::VanProtocol&>(*this), rendezvous_->store());
  transport_->set_payload_sink([this](PeerId peer, std::span<const std::byte> header, size_t bytes) {
    return landing_for(peer, header, bytes);
  });
  van_->start();  // finds the servers in the store, dials them and says hello; the I/O thread takes it from here
  io_ = std::thread([this] { io_main(); });
  std::unique_lock lock(mu_);
  state_cv_.wait(lock, [&] { return state_ != State::connecting; });
  if (state_ != State::ready) {
    const std::string why = failure_.message;
    lock.unlock();
    io_.join();
    throw std::runtime_error("parameter-server rendezvous at " + env_.root_addr + ":" + std::to_string(env_.root_port) +
                             " failed for worker " + std::to_string(env_.rank) + ": " + why);
  }
}

PsBackend::~PsBackend() { shutdown(); }

BackendCapabilities PsBackend::make_capabilities() {
  BackendCapabilities c = CommBackend::capabilities();
  c.reports_sent = true;
  c.joins = this;
  c.stragglers = this;
  if (cfg_.mode != "sync") return c;  // AsyncTable refuses encoded pushes (async_table.h says why)
  for (const compression::Codec& codec : compression::codecs())  // SlotTable decodes what the codec registry says
    if (codec.summing == compression::Summing::server_decodes)
      c.reduces_encoded |= BackendCapabilities::scheme_bit(codec.scheme);
  return c;
}

void PsBackend::do_start(std::vector<PartitionView> batch, BatchDone sent, BatchDone done) {
  Status refused;
  {
    std::lock_guard lock(mu_);
    if (state_ == State::ready && !stopping_) {
      queue_.push_back(Queued{std::move(batch), std::move(sent), std::move(done)});
    } else {
      refused = state_ == State::failed ? failure_ : Status::Error("ps backend is shut down", Status::Code::cancelled);
    }
  }
  if (refused.ok()) transport_->wake();
  else if (done) done(refused);
}

void PsBackend::shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  if (transport_) transport_->wake();
  if (io_.joinable() && io_.get_id() != std::this_thread::get_id()) io_.join();
}

std::string PsBackend::server_name(int s) const {
  return van_->name(van_->peer(PeerRole::server, static_cast<uint32_t>(s)));
}

void PsBackend::io_main() {
  const auto hb = van_->heartbeat();
  for (;;) {
    State st;
    bool stop;
    {
      std::lock_guard lock(mu_);
      st = state_;
      stop = stopping_;
    }
    if (stop) return finish_stopped();
    try {
      if (!van_->poll(hb)) return finish_failed();
      if (st == State::ready) {
        dispatch_queued();
        send_join_if_asked();
      }
    } catch (const std::exception& e) {
      fail_all(Status::Error(std::string("ps worker I/O failed: ") + e.what()));
    }
    if (van_->failed()) return finish_failed();
  }
}

void PsBackend::on_message(PeerId from, const control::Roster::Member& sender, const Header& h,
                           std::unique_ptr<Payload> payload) {
  const int server = static_cast<int>(sender.rank);
  switch (h.type) {
    case MsgType::assign_rep: return on_assignment(h);
    case MsgType::error:
      if (h.request_id == 0) return fail_all(Status::Error(payload_text(payload.get())));
      [[fallthrough]];
    case MsgType::sum:
    case MsgType::bcast_data: return on_answer(server, h, std::move(payload));
    case MsgType::sum_batch: return on_batch_answer(server, h, std::move(payload));
    case MsgType::received: return on_received(server, h);
    case MsgType::joined: return on_joined(server, h);
    case MsgType::lags: return on_lags(server, payload.get());
    default: return van_->malformed(from, "unexpected " + std::string(msg_type_name(h.type)) + " message");
  }
}

void PsBackend::on_ready() {
  std::lock_guard lock(mu_);
  state_ = State::ready;
  state_cv_.notify_all();
}

// The transport closes right after this: the callers' batches fail in finish_failed(), once nothing references them.
void PsBackend::on_failed(const Status& st) {
  std::lock_guard lock(mu_);
  failure_ = st;
  state_ = State::failed;  // from here on start() fails inline: nothing new can slip into the queue
  failed_queue_.swap(queue_);
}

void PsBackend::dispatch_queued() {
  std::deque<Queued> todo;
  {
    std::lock_guard lock(mu_);
    todo.swap(queue_);
  }
  for (Queued& q : todo) dispatch(q);
}

void PsBackend::dispatch(Queued& q) {
  std::vector<PartitionView>& batch = q.batch;
  BatchDone& done = q.done;
  std::string bad;
  for (const PartitionView& p : batch) {
    if (!p.task || p.bytes == 0) bad = "empty partition";
    else if (!supports(p.task->op, p.task->buffer.device))
      bad = "task '" + p.task->name + "': ps backend supports push_pull and broadcast on cpu buffers only";
    else if (p.dense_bytes / dtype_size(p.task->dtype) > UINT32_MAX)
      bad = "task '" + p.task->name + "': a compressed partition of " + std::to_string(p.dense_bytes) +
            " bytes has more than 2^32 elements; set a partition size (COMMSCHED_PARTITION_BYTES)";
  }
  if (batch.empty() || !bad.empty()) {
    if (done) done(Status::Error(bad.empty() ? "empty batch" : bad, Status::Code::invalid));
    return;
  }
  // Big partitions travel as several chunk messages (whole elements each); the batch completes when all are back.
  std::vector<PartitionView> pieces;
  for (const PartitionView& p : batch) {
    const uint64_t es = dtype_size(p.task->dtype);
    // An encoded range (top-k, signSGD) is one message: only the server's decoder knows where its elements are.
    const uint64_t chunk = cfg_.chunk_bytes == 0 || p.dense_bytes ? p.bytes
                                                                  : std::max<uint64_t>(es, cfg_.chunk_bytes / es * es);
    for (uint64_t at = 0; at < p.bytes; at += chunk)
      pieces.push_back(PartitionView{p.task, p.index, p.offset + at, std::min(chunk, p.bytes - at),
                                     p.payload ? p.payload + at : nullptr, p.dense_bytes});  // a stage's buffer, chunked alike
  }
  std::vector<std::vector<PartitionView>> requests = group_requests(std::move(pieces));
  const size_t acks = q.sent ? requests.size() : 0;
  auto state = std::make_shared<BatchState>(BatchState{std::move(done), std::move(q.sent), requests.size(), acks, Status::Ok()});
  for (std::vector<PartitionView>& parts : requests) {
    const uint64_t id = next_request_++;
    const PartitionView p = parts.front();
    Request& r = inflight_.emplace(id, Request{state, p}).first->second;
    if (parts.size() > 1) {
      r.fused = std::move(parts);
      send_batch(id, known_owner(p));
      continue;
    }
    const std::pair<uint64_t, uint64_t> where{p.task->key, p.offset};
    if (env_.num_servers == 1) {
      send_request(id, 0);
    } else if (auto it = owner_.find(where); it != owner_.end()) {
      send_request(id, it->second);
    } else {
      auto& waiting = parked_[where];
      if (waiting.empty()) {  // first to need this owner: ask the root's Sharder
        Header h = header(MsgType::assign_req);
        h.key = p.task->key;
        h.offset = p.offset;
        h.length = p.bytes;
        van_->send(van_->peer(PeerRole::server, 0), h);
      }
      waiting.push_back(id);
    }
  }
}

// Small partitions pay a message each way apiece (framing, a wake-up on both ends): batched, a run of them pays one.
// Bigger ones go alone, zero-copy from the tensor. `ps_goodput fused` (64 partitions a round, 1 worker, loopback, a
// loaded 2-core machine): batched 4 KiB partitions moved 2.2-6.2x the bytes of separate ones, 16 KiB 1.1-3.3x, but
// 64 KiB ones 0.57x (ZeroMQ) to 1.51x (UCX shared memory): the copies into and out of the batch and the lost overlap
// of several messages cost more than the messages saved.
constexpr uint64_t kBatchPartBytes = 32 << 10;   // partitions up to this size are batched
constexpr uint64_t kBatchBytes = 256 << 10;      // data per push_pull_batch, at most

bool PsBackend::batchable(const PartitionView& p) const {
  const TaskDesc& t = *p.task;
  return t.op == Op::push_pull && p.dense_bytes == 0 && lane_contributors_ == 0 && p.bytes <= kBatchPartBytes &&
         !(cfg_.mode != "sync" && is_gradient(t.name)) && known_owner(p) >= 0;
}

int PsBackend::known_owner(const PartitionView& p) const {
  if (env_.num_servers == 1) return 0;
  auto it = owner_.find({p.task->key, p.offset});
  return it == owner_.end() ? -1 : it->second;
}

std::vector<std::vector<PartitionView>> PsBackend::group_requests(std::vector<PartitionView> pieces) const {
  std::vector<std::vector<PartitionView>> out;
  std::map<int, size_t> open;  // server -> its batch being filled (an index into `out`)
  std::map<int, uint64_t> filled;
  for (const PartitionView& p : pieces) {
    if (!batchable(p)) {
      out.push_back({p});
      continue;
    }
    const int s = known_owner(p);
    auto it = open.find(s);
    if (it == open.end() || filled[s] + p.bytes > kBatchBytes || out[it->second].size() >= kMaxBatchEntries) {
      open[s] = out.size();
      filled[s] = 0;
      out.emplace_back();
    }
    out[open[s]].push_back(p);
    filled[s] += p.bytes;
  }
  return out;
}

// One message of the table and the partitions in place (a gather list: UCX reads each from its tensor; ZeroMQ copies
// them into its frame).
void PsBackend::send_batch(uint64_t id, int server) {
  Request& r = inflight_.at(id);
  r.server = server;
  std::vector<BatchEntry> es;
  for (const PartitionView& p : r.fused)
    es.push_back(BatchEntry{p.task->key, p.offset, p.bytes, p.task->bytes(), p.task->round, p.task->dtype, 0});
  const uint64_t bytes = batch_layout(es), table = es.front().at;
  std::shared_ptr<std::byte> buf = batch_buffers_->acquire(table);
  encode_batch_table(es, std::span(buf.get(), table));
  std::vector<const std::byte*> data;
  for (const PartitionView& p : r.fused) data.push_back(static_cast<const std::byte*>(p.data()));
  Header h = header(MsgType::push_pull_batch);
  h.iteration = r.part.task->iteration;
  h.request_id = id;
  h.aux = static_cast<uint32_t>(es.size());
  h.length = bytes;
  h.priority = r.part.task->priority;
  for (const PartitionView& p : r.fused) h.priority = std::min(h.priority, p.task->priority);
  if (r.batch->sent) h.flags |= kFlagAckReceipt;
  van_->send(van_->peer(PeerRole::server, static_cast<uint32_t>(server)), h,
             gathered(batch_pieces(es, std::span(buf.get(), table), data, bytes), [buf] {}));
}

void PsBackend::on_batch_answer(int server, const Header& h, std::unique_ptr<Payload> payload) {
  auto it = inflight_.find(h.request_id);
  if (it == inflight_.end())
    return fail_all(Status::Error(server_name(server) + " answered unknown request " + std::to_string(h.request_id)));
  if (!from_server_asked(server, h.request_id, it->second, "answered")) return;
  const std::vector<PartitionView>& parts = it->second.fused;
  const DecodedBatch b = decode_batch(h, payload ? payload->bytes() : std::span<const std::byte>{},
                                      DecodeLimits{cfg_.max_message_bytes});
  std::string bad = b.error;
  if (bad.empty() && b.entries.size() != parts.size()) bad = std::to_string(b.entries.size()) + " entries";
  for (size_t i = 0; bad.empty() && i < parts.size(); ++i)
    if (b.entries[i].key != parts[i].task->key || b.entries[i].offset != parts[i].offset ||
        b.entries[i].length != parts[i].bytes)
      bad = "entry " + std::to_string(i) + " is key " + std::to_string(b.entries[i].key) + " offset " +
            std::to_string(b.entries[i].offset);
  if (!bad.empty())
    return fail_all(Status::Error(server_name(server) + " answered request " + std::to_string(h.request_id) + " (" +
                                  std::to_string(parts.size()) + " batched partitions) wrongly: " + bad));
  for (size_t i = 0; i < parts.size(); ++i)
    std::memcpy(parts[i].data(), payload->bytes().data() + b.entries[i].at, parts[i].bytes);
  complete(h.request_id, Status::Ok());
}

void PsBackend::on_assignment(const Header& h) {
  if (h.aux >= static_cast<uint32_t>(env_.num_servers))
    return fail_all(Status::Error("root assigned key " + std::to_string(h.key) + " to unknown server " +
                                  std::to_string(h.aux)));
  const std::pair<uint64_t, uint64_t> where{h.key, h.offset};
  owner_[where] = static_cast<int>(h.aux);
  auto it = parked_.find(where);
  if (it == parked_.end()) return;
  for (uint64_t id : it->second) send_request(id, static_cast<int>(h.aux));
  parked_.erase(it);
}

void PsBackend::send_request(uint64_t id, int server) {
  Request& r = inflight_.at(id);
  r.server = server;
  const TaskDesc& t = *r.part.task;
  const bool bcast = t.op == Op::broadcast;
  Header h = header(bcast ? MsgType::bcast : MsgType::push_pull);
  h.dtype = t.dtype;
  h.key = t.key;
  h.offset = r.part.offset;
  h.length = r.part.bytes;
  h.tensor_bytes = t.bytes();
  h.iteration = t.iteration;
  h.round = t.round;
  h.request_id = id;
  h.priority = t.priority;
  h.aux = bcast ? static_cast<uint32_t>(t.root) : 0;
  if (r.part.dense_bytes && !bcast) {  // the server decodes, sums and encodes it again (SlotTable)
    h.codec = static_cast<uint8_t>(t.compression.scheme);
    h.elements = static_cast<uint32_t>(r.part.dense_bytes / dtype_size(t.dtype));
  }
  if (r.batch->sent) h.flags |= kFlagAckReceipt;
  if (lane_contributors_ && !bcast) {
    h.flags |= kFlagLane;
    h.aux = lane_contributors_;
  } else if (cfg_.mode != "sync" && !bcast && is_gradient(t.name)) {
    h.flags |= kFlagAsync;
  }
  OutPayload p;
  if (!bcast || t.root == env_.rank) p = OutPayload{r.part.data(), r.part.bytes, {}};  // zero-copy from the tensor
  van_->send(van_->peer(PeerRole::server, static_cast<uint32_t>(server)), h, std::move(p));
}

std::optional<std::span<std::byte>> PsBackend::landing_for(PeerId peer, std::span<const std::byte> header,
                                                           size_t bytes) {
  const Decoded d = decode_header(header, bytes);
  if (!d.header || (d.header->type != MsgType::sum && d.header->type != MsgType::bcast_data)) return std::nullopt;
  const Header& h = *d.header;
  auto it = inflight_.find(h.request_id);
  if (it == inflight_.end()) return std::nullopt;
  Request& r = it->second;
  const PartitionView& p = r.part;
  // Exactly the range asked for, from the server asked, once: anything else takes the checked path in on_answer.
  if (r.landing || r.server < 0 || !r.fused.empty() || van_->peer(PeerRole::server, static_cast<uint32_t>(r.server)) != peer ||
      h.key != p.task->key || h.offset != p.offset || h.length != p.bytes || bytes != p.bytes)
    return std::nullopt;
  r.landing = true;
  return std::span(p.data(), p.bytes);
}

void PsBackend::on_answer(int server, const Header& h, std::unique_ptr<Payload> payload) {
  auto it = inflight_.find(h.request_id);
  if (it == inflight_.end())
    return fail_all(Status::Error(server_name(server) + " answered unknown request " + std::to_string(h.request_id)));
  if (!from_server_asked(server, h.request_id, it->second, "answered")) return;
  const PartitionView& p = it->second.part;
  const bool landed = payload && payload->landed();
  // Another answer while the landing one is still being written into the tensor (or a landed one that is not this
  // request's): completing now could hand the tensor back while the transport writes into it. Failing closes the
  // transport before any callback runs.
  if (it->second.landing != landed || (landed && payload->bytes().data() != p.data()))
    return fail_all(Status::Error(server_name(server) + " answered request " + std::to_string(h.request_id) +
                                  " twice (a second answer while the first was arriving)"));
  it->second.landing = false;
  if (!it->second.fused.empty() && h.type != MsgType::error)
    return fail_all(Status::Error(server_name(server) + " answered batched request " + std::to_string(h.request_id) +
                                  " with a " + std::string(msg_type_name(h.type)) + ", not a sum_batch"));
  if (h.type == MsgType::error)
    return complete(h.request_id, Status::Error(payload_text(payload.get()) + " (from " + server_name(server) + ")",
                                                Status::Code::invalid));
  if (h.key != p.task->key || h.offset != p.offset || h.length != p.bytes)
    return fail_all(Status::Error(server_name(server) + " answered request " + std::to_string(h.request_id) +
                                  " with the wrong range for key " + std::to_string(h.key)));
  if (payload && !landed && !payload->bytes().empty()) std::memcpy(p.data(), payload->bytes().data(), p.bytes);
  complete(h.request_id, Status::Ok());
}

void PsBackend::on_received(int server, const Header& h) {
  auto it = inflight_.find(h.request_id);
  if (it == inflight_.end() || !it->second.batch->sent)
    return fail_all(Status::Error(server_name(server) + " acknowledged unknown request " + std::to_string(h.request_id)));
  if (!from_server_asked(server, h.request_id, it->second, "acknowledged")) return;
  mark_received(it->second);
}

// A confused or foreign server's answer is not the one asked for: taking it would hand back another range's sum.
bool PsBackend::from_server_asked(int server, uint64_t id, const Request& r, const char* verb) {
  if (r.server == server) return true;
  fail_all(Status::Error(server_name(server) + " " + verb + " request " + std::to_string(id) + ", which " +
                         (r.server < 0 ? std::string("was not sent yet (its owner is unknown)")
                                       : "was sent to " + server_name(r.server))));
  return false;
}

void PsBackend::mark_received(Request& r) {
  if (r.received || !r.batch->sent) return;
  r.received = true;
  if (--r.batch->unreceived == 0) std::exchange(r.batch->sent, nullptr)(Status::Ok());
}

void PsBackend::complete(uint64_t id, const Status& st) {
  auto it = inflight_.find(id);
  if (st.ok()) mark_received(it->second);  // an answer implies the push arrived, whatever became of its `received`
  auto batch = std::move(it->second.batch);
  inflight_.erase(it);
  if (!st.ok() && batch->status.ok()) batch->status = st;
  if (--batch->remaining == 0 && batch->done) batch->done(batch->status);
}

// finish_failed and finish_stopped run the callers' callbacks only once the transport is closed (Van::fail and
// Van::leave close it; the explicit close is a no-op then and states the rule): no answer can still be landing in a
// tensor that a callback hands back to its owner.
void PsBackend::finish_failed() {
  transport_->close(false);
  Status st;
  std::deque<Queued> queued;
  {
    std::lock_guard lock(mu_);
    st = failure_;
    queued.swap(failed_queue_);
    state_cv_.notify_all();
  }
  std::vector<std::shared_ptr<BatchState>> batches;
  for (auto& [id, r] : inflight_) batches.push_back(r.batch);
  inflight_.clear();
  parked_.clear();
  for (auto& b : batches)
    if (b->done) std::exchange(b->done, nullptr)(st);
  for (Queued& q : queued)
    if (q.done) q.done(st);
}

void PsBackend::finish_stopped() {
  van_->leave();  // the goodbye: servers exit 0 once every worker has said it
  transport_->close(false);
  const Status st = Status::Error("ps backend shut down", Status::Code::cancelled);
  std::deque<Queued> queued;
  {
    std::lock_guard lock(mu_);
    queued.swap(queue_);
    state_ = State::stopped;
    state_cv_.notify_all();
  }
  for (auto& [id, r] : inflight_)
    if (r.batch->done) std::exchange(r.batch->done, nullptr)(st);
  inflight_.clear();
  for (Queued& q : queued)
    if (q.done) q.done(st);
}

}  // namespace commsched
