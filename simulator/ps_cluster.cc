#include "simulator/ps_cluster.h"

#include <algorithm>
#include <cmath>

namespace commsched::sim {
namespace {

Nanos wire_time(uint64_t bytes, double bps) { return static_cast<Nanos>(std::llround(double(bytes) * 8e9 / bps)); }

}  // namespace

Nanos Sender::duration(uint64_t bytes) const { return wire_time(bytes, Bps_ * 8.0); }

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
    : p_(p), c_(compression), latency_(static_cast<Nanos>(std::llround(p.latency_s * 1e9))) {
  PsNetwork check(p);  // the same parameters must be valid for the symmetric model (and give the bounds)
  (void)check;
}

void PsClusterFabric::start(EventLoop& loop, BatchSink& sink) {
  loop_ = &loop;
  sink_ = &sink;
  const bool paced = !p_.server_ingress_limited;
  workers_.assign(size_t(p_.workers), WorkerState{Sender(p_.worker_bps, double(p_.emulated_burst_bytes), paced), {},
                                                  {}, {}, 0});
  servers_.assign(size_t(p_.servers),
                  ServerState{Sender(p_.server_bps, double(p_.emulated_burst_bytes), paced), {}, 0, 0});
  owner_.clear();
  slots_.clear();
  flows_.reset();
  if (p_.fair_share && p_.server_ingress_limited) build_flows(loop);
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

size_t PsClusterFabric::owner(int32_t key, uint64_t offset, uint64_t bytes) {
  auto [it, fresh] = owner_.try_emplace({key, offset}, 0);
  if (fresh) {  // least loaded, lowest index on ties (comm_backends/ps/sharder.cc)
    it->second = static_cast<size_t>(std::min_element(servers_.begin(), servers_.end(),
                                                      [](const ServerState& a, const ServerState& b) {
                                                        return a.load < b.load;
                                                      }) -
                                     servers_.begin());
    servers_[it->second].load += bytes;
  }
  return it->second;
}

Nanos PsClusterFabric::dispatch(int worker, size_t id, const Batch& batch, Nanos now) {
  WorkerState& w = workers_[size_t(worker)];
  if (w.batches.size() <= id) w.batches.resize(id + 1);
  uint64_t gradient = 0;
  for (const PartRef& part : batch) gradient += part.bytes;
  Nanos ready = now;  // when the pushes are encoded
  if (compressed(c_)) {
    ready = std::max(now, w.encoder_free) + encode_ns(c_, gradient);
    w.encoder_free = ready;
  }
  Nanos first = -1;
  uint32_t chunks = 0;
  for (const PartRef& part : batch) {  // one request per partition, as the PS backend sends a batch
    const uint64_t bytes = compressed(c_) ? wire_bytes(c_, part.bytes) : part.bytes;
    const bool whole = p_.chunk_bytes == 0 || server_recodes(c_);
    const uint64_t chunk = whole ? bytes : p_.chunk_bytes;
    for (uint64_t at = 0; at < bytes; at += chunk) {
      const uint64_t n = std::min(chunk, bytes - at);
      const uint64_t dense = whole ? part.bytes : 0;  // only a recoded push (always whole) costs the server CPU
      const size_t s = owner(part.priority, part.offset + at, n);
      const int round = w.rounds[{part.priority, part.offset + at}]++;
      auto arrived = [this, s, slot = SlotKey{{part.priority, part.offset + at}, round}, n, dense, worker, id] {
        on_push(s, slot, n, dense, {worker, id});
      };
      Nanos begin = ready;  // fair sharing: the timeline shows when the batch was handed to the connections
      if (flows_) {
        auto send = [this, conn = to_server(worker, s), n, arrived = std::move(arrived)]() mutable {
          flows_->send(conn, n, latency_, std::move(arrived));
        };
        if (ready > now) loop_->at(ready, std::move(send));  // after the encode stage
        else send();
      } else {
        begin = transmit(w.up, servers_[s].in, p_.server_bps, n, ready, std::move(arrived));
      }
      if (first < 0) first = begin;
      ++chunks;
    }
  }
  if (chunks == 0) {  // nothing to move
    loop_->at(ready, [this, worker, id] { sink_->batch_sent(worker, id, loop_->now()); });
    loop_->at(ready, [this, worker, id] { sink_->batch_done(worker, id, loop_->now()); });
  }
  w.batches[id] = {chunks, chunks, gradient};
  return first < 0 ? ready : first;
}

Nanos PsClusterFabric::transmit(Sender& from, Downlink& into, double into_bps, uint64_t bytes, Nanos now,
                                std::function<void()> arrived) {
  const Nanos start = from.send(now, bytes);
  if (from.paced()) {  // leaves whole; nothing limits the receiver
    loop_->at(start + latency_, std::move(arrived));
    return start;
  }
  // The receiver's downlink is taken when the message starts to flow (not at enqueue time, which would hold it for a
  // message still queued at its sender and so block other senders): from then on the slower side decides.
  const Nanos send_end = start + from.duration(bytes);
  loop_->at(start, [this, &into, into_bps, bytes, start, send_end, arrived = std::move(arrived)]() mutable {
    const Nanos end = std::max(send_end, into.reserve(start, wire_time(bytes, into_bps)));
    loop_->at(end + latency_, std::move(arrived));
  });
  return start;
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
  u.worker_up = busy_fractions(workers_, [](const WorkerState& w) { return w.up.busy(); }, until);
  u.server_out = busy_fractions(servers_, [](const ServerState& s) { return s.out.busy(); }, until);
  if (!p_.server_ingress_limited) return u;  // emulated links: nothing limits receiving
  u.worker_down = busy_fractions(workers_, [](const WorkerState& w) { return w.down.busy(); }, until);
  u.server_in = busy_fractions(servers_, [](const ServerState& s) { return s.in.busy(); }, until);
  return u;
}

void PsClusterFabric::on_push(size_t s, SlotKey slot, uint64_t bytes, uint64_t gradient_bytes, Waiter from) {
  const Nanos now = loop_->now();
  // The receipt first: it leaves behind whatever is already in the server's send queue (its size is negligible), or,
  // with fair sharing, behind what is queued on the connection to that worker.
  Sender& out = servers_[s].out;
  if (flows_) {
    flows_->send(to_worker(s, from.worker), 0, latency_, [this, from] { on_receipt(from); });
  } else {
    const Nanos receipt = (out.paced() ? out.send(now, 0) : out.start_of(now)) + latency_;
    loop_->at(receipt, [this, from] { on_receipt(from); });
  }
  ServerState& server = servers_[s];
  const bool recode = server_recodes(c_) && gradient_bytes > 0;
  if (recode) server.cpu_free = std::max(now, server.cpu_free) + decode_ns(c_, gradient_bytes);  // decode_add
  auto& waiters = slots_[slot];
  waiters.push_back(from);
  if (waiters.size() < size_t(p_.workers)) return;
  if (!recode) return send_sums(s, slot, bytes);
  server.cpu_free += encode_ns(c_, gradient_bytes);  // encode_sum, after the last push's decode
  loop_->at(server.cpu_free, [this, s, slot, bytes] { send_sums(s, slot, bytes); });
}

void PsClusterFabric::send_sums(size_t s, SlotKey slot, uint64_t bytes) {
  const Nanos now = loop_->now();
  for (const Waiter& w : slots_[slot]) {  // the sum goes to each worker in the order their pushes arrived
    if (flows_) flows_->send(to_worker(s, w.worker), bytes, latency_, [this, w] { on_sum(w); });
    else transmit(servers_[s].out, workers_[size_t(w.worker)].down, p_.worker_bps, bytes, now, [this, w] { on_sum(w); });
  }
  slots_.erase(slot);
}

void PsClusterFabric::on_receipt(Waiter w) {
  if (--workers_[size_t(w.worker)].batches[w.batch].receipts == 0) sink_->batch_sent(w.worker, w.batch, loop_->now());
}

void PsClusterFabric::on_sum(Waiter w) {
  BatchState& b = workers_[size_t(w.worker)].batches[w.batch];
  if (--b.sums != 0) return;
  if (!compressed(c_)) return sink_->batch_done(w.worker, w.batch, loop_->now());
  loop_->at(loop_->now() + decode_ns(c_, b.gradient_bytes),
            [this, w] { sink_->batch_done(w.worker, w.batch, loop_->now()); });
}

}  // namespace commsched::sim
