#include "simulator/network.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "scheduler/auto_knobs.h"

namespace commsched::sim {

uint64_t batch_bytes(const Batch& batch) {
  uint64_t n = 0;
  for (const PartRef& p : batch) n += p.bytes;
  return n;
}

namespace {

Nanos seconds_to_ns(double s) { return static_cast<Nanos>(std::llround(s * 1e9)); }

void check_positive(const char* what, double v) {
  if (!(v > 0) || !std::isfinite(v))
    throw InvalidArgument(std::string("network model: ") + what + " must be a finite number > 0, got " +
                          std::to_string(v));
}

std::string gbit(double bps) {
  std::ostringstream s;
  s << bps / 1e9 << " Gbit/s";
  return s.str();
}

}  // namespace

PsNetwork::PsNetwork(PsParams p) : p_(p), latency_(seconds_to_ns(p.latency_s)) {
  check_positive("workers", p.workers);
  check_positive("servers", p.servers);
  check_positive("worker bandwidth", p.worker_bps);
  check_positive("server bandwidth", p.server_bps);
  if (!(p.latency_s >= 0)) throw InvalidArgument("network model: latency must be >= 0 s");
  if (!(p.message_s >= 0)) throw InvalidArgument("network model: per-message cost must be >= 0 s");
  servers_.resize(p_.sharded ? static_cast<size_t>(p_.servers) : 1);
}

// Each message also costs its fixed per-message time on every real NIC it crosses (PsParams::message_s).
double PsNetwork::message_s() const { return p_.server_ingress_limited ? p_.message_s : 0; }

Nanos PsNetwork::worker_time(uint64_t bytes) const {
  return seconds_to_ns(bytes * 8.0 / p_.worker_bps + message_s());
}

Nanos PsNetwork::server_time(uint64_t bytes, double share) const {
  return seconds_to_ns(p_.workers * share * (bytes * 8.0 / p_.server_bps + message_s()));
}

PsNetwork::Server& PsNetwork::owner(int32_t key, uint64_t offset, uint64_t bytes) {
  auto [it, fresh] = owner_.try_emplace({key, offset}, 0);
  if (fresh) {  // least loaded, lowest index on ties (comm_backends/ps/sharder.cc)
    it->second = static_cast<size_t>(
        std::min_element(servers_.begin(), servers_.end(), [](const Server& a, const Server& b) { return a.load < b.load; }) -
        servers_.begin());
    servers_[it->second].load += bytes;
  }
  return servers_[it->second];
}

Transfer PsNetwork::transfer(const Batch& batch, Nanos start) {
  if (!p_.sharded) return transfer_message(-1, 0, batch_bytes(batch), start);
  Transfer whole{-1, 0, 0};
  for (const PartRef& p : batch) {  // one request per partition, as the PS backend sends a batch
    const Transfer t = transfer_message(p.priority, p.offset, p.bytes, start);
    if (whole.begin < 0) whole.begin = t.begin;
    whole.end = std::max(whole.end, t.end);
    whole.sent = std::max(whole.sent, t.sent);
  }
  return whole;
}

Transfer PsNetwork::transfer_message(int32_t key, uint64_t offset, uint64_t bytes, Nanos start) {
  const uint64_t chunk = p_.chunk_bytes == 0 ? bytes : p_.chunk_bytes;
  Transfer whole{-1, 0, 0};
  for (uint64_t at = 0; at < bytes; at += chunk) {  // chunks leave back to back; each is pulled once summed
    const uint64_t n = std::min(chunk, bytes - at);
    const Transfer t = p_.sharded ? transfer_one(n, start, owner(key, offset + at, n), 1.0)
                                  : transfer_one(n, start, servers_[0], 1.0 / p_.servers);
    if (whole.begin < 0) whole.begin = t.begin;
    whole.end = std::max(whole.end, t.end);
    whole.sent = std::max(whole.sent, t.sent);  // the message is sent when every chunk's receipt is back
  }
  if (whole.begin < 0) whole = {start, start, start};  // nothing to move
  return whole;
}

Transfer PsNetwork::transfer_one(uint64_t bytes, Nanos start, Server& server, double share) {
  const Nanos begin = std::max(worker_up_.start_of(start), server.in.start_of(start));
  // The bytes stream through the worker's uplink and the server's downlink at once; the slower side decides.
  const Nanos ingress = p_.server_ingress_limited ? server_time(bytes, share) : 0;
  const Nanos pushed = std::max(worker_up_.reserve(start, worker_time(bytes)), server.in.reserve(start, ingress)) + latency_;
  // The receipt goes out first, queued behind the pulls already in the server's send queue (its size is negligible).
  const Nanos sent = server.out.start_of(pushed) + latency_;
  // The server answers once every worker's push is summed (symmetric workers: all arrive together).
  const Nanos end = std::max(server.out.reserve(pushed, server_time(bytes, share)),
                             worker_down_.reserve(pushed, worker_time(bytes))) + latency_;
  return {begin, end, std::min(sent, end)};
}

void PsNetwork::reset() {
  worker_up_.reset();
  worker_down_.reset();
  for (Server& s : servers_) s = Server{};
  owner_.clear();
}

double PsNetwork::comm_lower_bound_s(uint64_t bytes) const {
  // Each direction of the worker NIC carries every byte once; each server NIC carries W/S of them.
  return std::max(bytes * 8.0 / p_.worker_bps, bytes * 8.0 * p_.workers / p_.servers / p_.server_bps);
}

CostModel PsNetwork::cost_model() const {
  const double per_byte = 8.0 * std::max(1.0 / p_.worker_bps, double(p_.workers) / p_.servers / p_.server_bps);
  // A message's fixed cost, like its bytes, counts where it is largest: a server gets W/S messages for each one sent.
  const double per_message = message_s() * std::max(1.0, double(p_.workers) / p_.servers);
  return {2 * (p_.latency_s + per_message), 2 * per_byte};
}

std::string PsNetwork::describe() const {
  std::ostringstream s;
  s << "PS " << p_.workers << " workers x " << gbit(p_.worker_bps) << ", " << p_.servers << " servers x "
    << gbit(p_.server_bps) << ", latency " << p_.latency_s * 1e6 << " us"
    << (p_.sharded ? ", keys sharded whole" : ", keys spread evenly")
    << (p_.server_ingress_limited ? "" : ", server ingress unlimited (emulated links)");
  if (message_s() > 0) s << ", " << message_s() * 1e6 << " us per message";
  return s.str();
}

RingAllreduceNetwork::RingAllreduceNetwork(RingParams p) : p_(p) {
  check_positive("workers", p.workers);
  check_positive("bandwidth", p.bandwidth_bps);
  if (!(p.alpha_s >= 0)) throw InvalidArgument("network model: ring alpha must be >= 0 s");
}

Transfer RingAllreduceNetwork::transfer(const Batch& batch, Nanos start) {
  const CostModel c = cost_model();
  const Nanos begin = ring_.start_of(start);
  return {begin, ring_.reserve(start, seconds_to_ns(c.alpha_s + c.beta_s_per_byte * batch_bytes(batch)))};
}

double RingAllreduceNetwork::comm_lower_bound_s(uint64_t bytes) const {
  return cost_model().beta_s_per_byte * bytes;
}

// The automatic knobs size all-reduce partitions by this same cost (scheduler/auto_knobs.h).
CostModel RingAllreduceNetwork::cost_model() const {
  const MessageCost c = ring_allreduce_cost(p_.workers, p_.bandwidth_bps, p_.alpha_s);
  return {c.alpha_s, c.beta_s_per_byte};
}

std::string RingAllreduceNetwork::describe() const {
  std::ostringstream s;
  s << "ring all-reduce " << p_.workers << " workers x " << gbit(p_.bandwidth_bps) << ", alpha "
    << p_.alpha_s * 1e6 << " us";
  return s.str();
}

}  // namespace commsched::sim
