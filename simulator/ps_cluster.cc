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

PsClusterFabric::PsClusterFabric(PsParams p)
    : p_(p), latency_(static_cast<Nanos>(std::llround(p.latency_s * 1e9))) {
  PsNetwork check(p);  // the same parameters must be valid for the symmetric model (and give the bounds)
  (void)check;
}

void PsClusterFabric::start(EventLoop& loop, BatchSink& sink) {
  loop_ = &loop;
  sink_ = &sink;
  const bool paced = !p_.server_ingress_limited;
  workers_.assign(size_t(p_.workers), WorkerState{Sender(p_.worker_bps, double(p_.emulated_burst_bytes), paced), {},
                                                  {}, {}});
  servers_.assign(size_t(p_.servers), ServerState{Sender(p_.server_bps, double(p_.emulated_burst_bytes), paced), {}, 0});
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
  Nanos first = -1;
  uint32_t chunks = 0;
  for (const PartRef& part : batch) {  // one request per partition, as the PS backend sends a batch
    const uint64_t chunk = p_.chunk_bytes == 0 ? part.bytes : p_.chunk_bytes;
    for (uint64_t at = 0; at < part.bytes; at += chunk) {
      const uint64_t n = std::min(chunk, part.bytes - at);
      const size_t s = owner(part.priority, part.offset + at, n);
      const int round = w.rounds[{part.priority, part.offset + at}]++;
      auto arrived = [this, s, slot = SlotKey{{part.priority, part.offset + at}, round}, n, worker, id] {
        on_push(s, slot, n, {worker, id});
      };
      Nanos begin = now;  // fair sharing: the timeline shows when the batch was handed to the connections
      if (flows_) flows_->send(to_server(worker, s), n, latency_, std::move(arrived));
      else begin = transmit(w.up, servers_[s].in, p_.server_bps, n, now, std::move(arrived));
      if (first < 0) first = begin;
      ++chunks;
    }
  }
  if (chunks == 0) {  // nothing to move
    loop_->at(now, [this, worker, id, now] { sink_->batch_sent(worker, id, now); });
    loop_->at(now, [this, worker, id, now] { sink_->batch_done(worker, id, now); });
  }
  w.batches[id] = {chunks, chunks};
  return first < 0 ? now : first;
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

void PsClusterFabric::on_push(size_t s, SlotKey slot, uint64_t bytes, Waiter from) {
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
  auto& waiters = slots_[slot];
  waiters.push_back(from);
  if (waiters.size() < size_t(p_.workers)) return;
  for (const Waiter& w : waiters) {  // the sum goes to each worker in the order their pushes arrived
    if (flows_) flows_->send(to_worker(s, w.worker), bytes, latency_, [this, w] { on_sum(w); });
    else transmit(out, workers_[size_t(w.worker)].down, p_.worker_bps, bytes, now, [this, w] { on_sum(w); });
  }
  slots_.erase(slot);
}

void PsClusterFabric::on_receipt(Waiter w) {
  if (--workers_[size_t(w.worker)].batches[w.batch].first == 0) sink_->batch_sent(w.worker, w.batch, loop_->now());
}

void PsClusterFabric::on_sum(Waiter w) {
  if (--workers_[size_t(w.worker)].batches[w.batch].second == 0) sink_->batch_done(w.worker, w.batch, loop_->now());
}

}  // namespace commsched::sim
