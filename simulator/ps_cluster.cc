#include "simulator/ps_cluster.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace commsched::sim {
Nanos Sender::start_of(Nanos ready) const {
  const Nanos start = std::max(ready, free_at_);
  if (!paced_) return start;
  const double tokens = std::min(burst_, tokens_ + double(start - free_at_) * 1e-9 * Bps_);
  return tokens >= 0 ? start : start + static_cast<Nanos>(std::ceil(-tokens / Bps_ * 1e9));
}

Nanos Sender::send(Nanos ready, uint64_t bytes) {
  const Nanos start = start_of(ready);
  busy_ += duration(bytes);
  if (paced_) {
    tokens_ = std::min(burst_, tokens_ + double(start - free_at_) * 1e-9 * Bps_);
    tokens_ = std::max(tokens_, 0.0) - double(bytes);  // the rounding up above may leave a hair of debt
    free_at_ = start;
  } else {
    free_at_ = start + duration(bytes);
  }
  return start;
}

PsClusterFabric::PsClusterFabric(PsParams p, CompressionModel compression)
    : p_(p),
      c_(compression),
      latency_(static_cast<Nanos>(std::llround(p.latency_s * 1e9))),
      message_ns_(p.server_ingress_limited && !p.fair_share ? static_cast<Nanos>(std::llround(p.message_s * 1e9)) : 0),
      into_server_(p.server_bps, message_ns_),
      into_worker_(p.worker_bps, message_ns_) {
  PsNetwork check(p);  // the same parameters must be valid for the symmetric model (and give the bounds)
  (void)check;
}

void PsClusterFabric::start(EventLoop& loop, BatchSink& sink) {
  loop_ = &loop;
  sink_ = &sink;
  const bool paced = !p_.server_ingress_limited;
  workers_.assign(size_t(p_.workers),
                  WorkerState{{Sender(p_.worker_bps, double(p_.emulated_burst_bytes), paced, message_ns_), {}}, 0});
  servers_.assign(size_t(p_.servers),
                  ServerState{{Sender(p_.server_bps, double(p_.emulated_burst_bytes), paced, message_ns_), {}}, {}, 0, 0, {}});
  worker_down_.assign(size_t(p_.workers), {});
  server_in_.assign(size_t(p_.servers), {});
  batches_.assign(size_t(p_.workers), {});
  chunk_ids_.clear();
  chunks_.clear();
  flows_.reset();
  if (p_.fair_share && p_.server_ingress_limited) build_flows(loop);
  for (ServerState& s : servers_) s.ready = ReplyOrder<Reply>(std::max<uint64_t>(1, p_.reply_overtakes));
}

void PsClusterFabric::build_flows(EventLoop& loop) {
  flows_ = std::make_unique<FlowNet>(loop);
  worker_links_.clear();
  server_links_.clear();
  for (size_t w = 0; w < workers_.size(); ++w)
    for (int dir = 0; dir < 2; ++dir) worker_links_.push_back(flows_->add_link(p_.worker_bps));
  for (size_t s = 0; s < servers_.size(); ++s)
    for (int dir = 0; dir < 2; ++dir) server_links_.push_back(flows_->add_link(p_.server_bps));
  worker_conn_.clear();
  server_conn_.clear();
  for (size_t w = 0; w < workers_.size(); ++w)
    for (size_t s = 0; s < servers_.size(); ++s)
      worker_conn_.push_back(flows_->add_connection(worker_links_[2 * w], server_links_[2 * s + 1]));
  for (size_t s = 0; s < servers_.size(); ++s)
    for (size_t w = 0; w < workers_.size(); ++w)
      server_conn_.push_back(flows_->add_connection(server_links_[2 * s], worker_links_[2 * w + 1]));
}

uint32_t PsClusterFabric::chunk_id(int32_t key, uint64_t offset, uint64_t bytes, uint64_t dense) {
  auto [it, fresh] = chunk_ids_.try_emplace({key, offset}, uint32_t(chunks_.size()));
  if (fresh) {  // least loaded, lowest index on ties (comm_backends/ps/sharder.cc)
    const size_t s = static_cast<size_t>(
        std::min_element(servers_.begin(), servers_.end(),
                         [](const ServerState& a, const ServerState& b) { return a.load < b.load; }) -
        servers_.begin());
    servers_[s].load += bytes;
    chunks_.push_back({s, bytes, dense, key, {}});  // the key is the partition's priority (dispatch)
  } else if (chunks_[it->second].bytes != bytes || chunks_[it->second].dense != dense) {
    throw std::logic_error("PsClusterFabric: chunk (" + std::to_string(key) + ", " + std::to_string(offset) +
                           ") changed size within a run");
  }
  return it->second;
}

uint64_t PsClusterFabric::messages_of(const Batch& batch, bool whole) const {
  uint64_t messages = 0;
  for (const PartRef& part : batch) {
    const uint64_t bytes = compressed(c_) ? wire_bytes(c_, part.bytes) : part.bytes;
    messages += whole ? uint64_t(bytes > 0) : (bytes + p_.chunk_bytes - 1) / p_.chunk_bytes;
  }
  return messages;
}

Nanos PsClusterFabric::dispatch(int worker, size_t id, const Batch& batch, Nanos now) {
  WorkerState& w = workers_[size_t(worker)];
  const bool whole = p_.chunk_bytes == 0 || server_recodes(c_);
  const uint64_t messages = messages_of(batch, whole);
  const bool only = messages == 1 && !flows_;  // fair sharing counts every batch's receipts and sums
  const uint64_t gradient = batch_bytes(batch);
  Nanos ready = now;  // when the pushes are encoded
  if (compressed(c_)) {
    ready = std::max(now, w.encoder_free) + encode_ns(c_, gradient);
    w.encoder_free = ready;
  }
  Nanos first = -1;
  uint32_t chunks = 0;
  for (const PartRef& part : batch) {  // one request per partition, as the PS backend sends a batch
    const uint64_t bytes = compressed(c_) ? wire_bytes(c_, part.bytes) : part.bytes;
    const uint64_t chunk = whole ? bytes : p_.chunk_bytes;
    for (uint64_t at = 0; at < bytes; at += chunk) {
      const uint64_t n = std::min(chunk, bytes - at);
      const uint64_t dense = whole ? part.bytes : 0;  // only a recoded push (always whole) costs the server CPU
      const uint32_t c = chunk_id(part.priority, part.offset + at, n, dense);
      Nanos begin = ready;  // fair sharing: the timeline shows when the batch was handed to the connections
      if (flows_) {
        auto send = [this, conn = to_server(worker, chunks_[c].server), n, c, worker, id] {
          flows_->send(conn, n, latency_, [this, c, worker, id] { on_push(c, worker, id, false); });
        };
        if (ready > now) loop_->at(ready, std::move(send));  // after the encode stage
        else send();
      } else {
        begin = transmit(w.up, true, {ready, 0, n, c, worker, id, only});
      }
      if (first < 0) first = begin;
      ++chunks;
    }
  }
  if (chunks == 0) {  // nothing to move
    loop_->at(ready, [this, worker, id] { sink_->batch_sent(worker, id, loop_->now()); });
    loop_->at(ready, [this, worker, id] { sink_->batch_done(worker, id, loop_->now()); });
  }
  if (chunks != messages) throw std::logic_error("PsClusterFabric: a batch's messages miscounted");
  if (!only || compressed(c_)) {  // what the batch's messages and its decode stage need (see BatchState)
    std::vector<BatchState>& batches = batches_[size_t(worker)];
    if (batches.size() <= id) batches.resize(id + 1);
    batches[id] = {chunks, chunks, {}, {}, gradient};
  }
  return first < 0 ? ready : first;
}

// `m.start` on the way in: when the message is ready to leave.
Nanos PsClusterFabric::transmit(Queue& from, bool to_server, const Outgoing& m) {
  const Nanos start = from.sender.send(m.start, m.bytes);
  if (from.sender.paced()) {  // leaves whole; nothing limits the receiver
    arrive(to_server, m, start + latency_);
    return start;
  }
  // The receiver's downlink is taken when the message starts to flow (not at enqueue time, which would hold it for a
  // message still queued at its sender and so block other senders): from then on the slower side decides. The
  // sender's messages start in order, so one start event on the loop at a time serves its queue.
  from.pending.push_back({start, loop_->take_turn(), m.bytes, m.chunk, m.worker, m.batch, m.only});
  if (from.pending.size() == 1) post_start(from, to_server);
  return start;
}

void PsClusterFabric::post_start(Queue& from, bool to_server) {
  const Outgoing& head = from.pending.front();
  loop_->post_in_turn(head.start, head.turn, [](void* f, uint64_t queue, uint64_t to_server) {
    static_cast<PsClusterFabric*>(f)->start_next(*reinterpret_cast<Queue*>(queue), to_server != 0);
  }, this, reinterpret_cast<uintptr_t>(&from), to_server);
}

void PsClusterFabric::start_next(Queue& from, bool to_server) {
  const Outgoing m = from.pending.front();
  from.pending.pop_front();
  if (!from.pending.empty()) post_start(from, to_server);
  deliver(from.sender, to_server, m);
}

void PsClusterFabric::deliver(const Sender& from, bool to_server, const Outgoing& m) {
  const Nanos send_end = m.start + from.duration(m.bytes);
  Downlink& into = to_server ? server_in_[chunks_[m.chunk].server] : worker_down_[size_t(m.worker)];
  const Nanos in = to_server ? into_server_(m.bytes) : into_worker_(m.bytes);
  arrive(to_server, m, std::max(send_end, into.reserve(m.start, in)) + latency_);
}

void PsClusterFabric::arrive(bool to_server, const Outgoing& m, Nanos at) {
  if (!to_server)
    return sum_known(m.worker, m.batch, m.only, at, loop_->take_turn(), workers_[size_t(m.worker)].sums);
  ServerState& server = servers_[chunks_[m.chunk].server];
  const Arrival a{at, loop_->take_turn(), m.chunk, m.worker, m.batch, m.only};
  auto on_push = [](void* f, const Arrival& a) {
    static_cast<PsClusterFabric*>(f)->on_push(a.chunk, a.worker, a.batch, a.only);
  };
  if (server.arriving.add(*loop_, a, this, on_push)) return;
  loop_->post_in_turn(a.at, a.turn, [](void* f, uint64_t c, uint64_t b) {
    static_cast<PsClusterFabric*>(f)->on_push(uint32_t(c >> 32), int(uint32_t(c)), size_t(b >> 1), (b & 1) != 0);
  }, this, uint64_t(a.chunk) << 32 | uint32_t(a.worker), uint64_t(a.batch) << 1 | uint64_t(a.only));
}

namespace {

template <class Links, class Busy>
LinkBusy busy_fractions(const Links& links, Busy busy, Nanos until) {
  LinkBusy b{0, 1, 0};
  if (links.empty() || until <= 0) return {};
  for (const auto& l : links) {
    const double f = std::min(1.0, double(busy(l)) / double(until));
    b.mean += f / double(links.size());
    b.min = std::min(b.min, f);
    b.max = std::max(b.max, f);
  }
  return b;
}

}  // namespace

LinkUse PsClusterFabric::link_use(Nanos until) const {
  LinkUse u;
  u.have = true;
  if (flows_) {
    auto of = [&](const std::vector<int>& links, int dir) {
      std::vector<Nanos> busy;
      for (size_t i = dir; i < links.size(); i += 2) busy.push_back(flows_->busy(links[i]));
      return busy_fractions(busy, [](Nanos b) { return b; }, until);
    };
    u.worker_up = of(worker_links_, 0);
    u.worker_down = of(worker_links_, 1);
    u.server_out = of(server_links_, 0);
    u.server_in = of(server_links_, 1);
    return u;
  }
  u.worker_up = busy_fractions(workers_, [](const WorkerState& w) { return w.up.sender.busy(); }, until);
  u.server_out = busy_fractions(servers_, [](const ServerState& s) { return s.out.sender.busy(); }, until);
  if (!p_.server_ingress_limited) return u;  // emulated links: nothing limits receiving
  u.worker_down = busy_fractions(worker_down_, [](const Downlink& d) { return d.busy(); }, until);
  u.server_in = busy_fractions(server_in_, [](const Downlink& d) { return d.busy(); }, until);
  return u;
}

// Every push crosses the worker's uplink at most at its rate: FIFO, one message after another, each for its bytes /
// rate rounded to the nanosecond (so up to half a nanosecond less per message: a partition is at most bytes / chunk
// + 1 of them), or shared fairly with its other connections. Emulated links promise nothing (a token bucket lets a
// burst and a whole message through at once), nor does compression (its bytes on the wire differ).
Nanos PsClusterFabric::min_push_ns(uint64_t bytes, uint64_t parts) const {
  if (!p_.server_ingress_limited || compressed(c_)) return 0;
  const double messages = double(parts) + (p_.chunk_bytes > 0 ? double(bytes) / double(p_.chunk_bytes) : 0.0);
  // Each partition is one message at least, and each message also holds the link for message_ns_ (exact: added after
  // the rounding).
  const double ns = double(bytes) * 8e9 / p_.worker_bps * (1 - 1e-12) - 0.5 * messages - 1 + double(parts * message_ns_);
  return ns > 0 ? static_cast<Nanos>(ns) : 0;
}

void PsClusterFabric::on_push(uint32_t chunk, int worker, size_t batch, bool only) {
  const Nanos now = loop_->now();
  Chunk& c = chunks_[chunk];
  ServerState& server = servers_[c.server];
  // The receipt first (its size is negligible): into the server's reply queue, where the rule sends it ahead of data;
  // in arrival order, behind whatever is already in the server's send queue; with fair sharing, behind what is queued
  // on the connection to that worker.
  if (flows_) {
    flows_->send(to_worker(c.server, worker), 0, latency_, [this, worker, batch] { on_receipt(worker, batch); });
  } else if (ordered_replies()) {
    queue_reply(c.server, {true, chunk, worker, batch, only});
  } else {
    Sender& out = server.out.sender;
    receipt_known(worker, batch, only, (out.paced() ? out.send(now, 0) : out.start_of(now)) + latency_,
                  loop_->take_turn(), server.receipts);
  }
  const bool recode = server_recodes(c_) && c.dense > 0;
  if (recode) server.cpu_free = std::max(now, server.cpu_free) + decode_ns(c_, c.dense);  // decode_add
  // A worker pushes the next round of a chunk only once it has this round's sum, so one round collects at a time.
  if (c.waiting.size() >= size_t(p_.workers))
    throw std::logic_error("PsClusterFabric: a push of the next round came early");
  c.waiting.push_back({worker, only, batch});
  if (c.waiting.size() < size_t(p_.workers)) return;
  if (!recode) return send_sums(chunk);
  server.cpu_free += encode_ns(c_, c.dense);  // encode_sum, after the last push's decode
  loop_->at(server.cpu_free, [this, chunk] { send_sums(chunk); });
}

void PsClusterFabric::send_sums(uint32_t chunk) {
  Chunk& c = chunks_[chunk];
  const Nanos now = loop_->now();
  for (const Waiter& w : c.waiting) {  // the sum goes to each worker in the order their pushes arrived
    if (flows_)
      flows_->send(to_worker(c.server, w.worker), c.bytes, latency_, [this, w] { on_sum(w.worker, w.batch); });
    else if (ordered_replies())
      queue_reply(c.server, {false, chunk, w.worker, w.batch, w.only});
    else
      transmit(servers_[c.server].out, false, {now, 0, c.bytes, chunk, w.worker, w.batch, w.only});
  }
  c.waiting.clear();
}

// The send happens in an event at the moment the link can take a message, not at once: replies that become ready at
// the same instant (a receipt and the sums its push completed) are all in the queue when the rule picks.
void PsClusterFabric::queue_reply(size_t server, const Reply& r) {
  ServerState& s = servers_[server];
  s.ready.push(r, r.receipt, chunks_[r.chunk].priority);
  if (!s.send_posted) post_send(server);
}

void PsClusterFabric::post_send(size_t server) {
  ServerState& s = servers_[server];
  s.send_posted = true;
  loop_->post_in_turn(s.out.sender.start_of(loop_->now()), loop_->take_turn(), [](void* f, uint64_t server, uint64_t) {
    static_cast<PsClusterFabric*>(f)->send_replies(size_t(server));
  }, this, server);
}

// Receipts take no time on the link (header-only, as before), so every receipt the rule puts first goes now; the
// first sum then holds the link, and the next pick waits until the sender can take another message.
void PsClusterFabric::send_replies(size_t server) {
  ServerState& s = servers_[server];
  s.send_posted = false;
  const Nanos now = loop_->now();
  while (!s.ready.empty()) {
    const Reply r = s.ready.pop();
    if (r.receipt) {
      receipt_known(r.worker, r.batch, r.only, now + latency_, loop_->take_turn(), s.receipts);
      continue;
    }
    const Outgoing m{s.out.sender.send(now, chunks_[r.chunk].bytes), 0, chunks_[r.chunk].bytes, r.chunk, r.worker,
                     r.batch, r.only};
    if (s.out.sender.paced()) arrive(false, m, m.start + latency_);
    else deliver(s.out.sender, false, m);
    break;
  }
  if (!s.ready.empty()) post_send(server);
}

void PsClusterFabric::receipt_known(int worker, size_t batch, bool only, Nanos at, uint64_t turn, DueQueue& via) {
  if (only) return fall_due(via, {at, turn, worker, batch});
  BatchState& b = batches_[size_t(worker)][batch];
  b.last_receipt.take(at, turn);
  if (--b.receipts == 0) fall_due(via, {b.last_receipt.at, b.last_receipt.turn, worker, batch});
}

void PsClusterFabric::sum_known(int worker, size_t batch, bool only, Nanos at, uint64_t turn, DueQueue& via) {
  if (only) return fall_due(via, {at, turn, worker, batch});
  BatchState& b = batches_[size_t(worker)][batch];
  b.last_sum.take(at, turn);
  if (--b.sums == 0) fall_due(via, {b.last_sum.at, b.last_sum.turn, worker, batch});
}

// A server's receipts leave its send queue in order, and a worker's sums mostly arrive in order (its downlink is
// FIFO); a batch whose last one came through another queue, or a sum that overtakes (a slower sender), goes on the
// loop itself.
void PsClusterFabric::fall_due(DueQueue& via, const Due& d) {
  auto fire = via.sums ? +[](void* f, const Due& d) { static_cast<PsClusterFabric*>(f)->on_due(true, d.worker, d.batch); }
                       : +[](void* f, const Due& d) { static_cast<PsClusterFabric*>(f)->on_due(false, d.worker, d.batch); };
  auto warm = +[](void* f, const Due& d) { static_cast<PsClusterFabric*>(f)->sink_->upcoming(d.worker, d.batch); };
  if (via.due.add(*loop_, d, this, fire, warm)) return;
  loop_->post_in_turn(d.at, d.turn, [](void* f, uint64_t w, uint64_t id) {
    static_cast<PsClusterFabric*>(f)->on_due(w >> 32 != 0, int(uint32_t(w)), size_t(id));
  }, this, uint64_t(via.sums) << 32 | uint32_t(d.worker), d.batch);
}

void PsClusterFabric::on_due(bool sum, int worker, size_t batch) {
  if (sum) return sums_in(worker, batch);
  sink_->batch_sent(worker, batch, loop_->now());
}

void PsClusterFabric::on_receipt(int worker, size_t batch) {
  if (--batches_[size_t(worker)][batch].receipts == 0) sink_->batch_sent(worker, batch, loop_->now());
}

void PsClusterFabric::on_sum(int worker, size_t batch) {
  if (--batches_[size_t(worker)][batch].sums == 0) sums_in(worker, batch);
}

void PsClusterFabric::sums_in(int worker, size_t batch) {
  if (!compressed(c_)) return sink_->batch_done(worker, batch, loop_->now());
  const uint64_t gradient = batches_[size_t(worker)][batch].gradient_bytes;
  loop_->at(loop_->now() + decode_ns(c_, gradient), [this, worker, batch] {
    sink_->batch_done(worker, batch, loop_->now());
  });
}

}  // namespace commsched::sim
