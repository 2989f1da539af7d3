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

// Why no schedule beats it. Each of a worker's messages holds that worker's uplink for its bytes / rate plus the
// per-message cost m (both link models with FIFO links: this one and ps_cluster.h; m is 0 on emulated links and
// with fair sharing, which do not charge it), and its pull holds the worker's downlink as long. A partition never
// spans two tensors and travels as its own request, cut into chunks of at most chunk_bytes, so a tensor of b bytes
// is at least ceil(b / chunk) messages (min_messages), whatever the partition, credit or fusion: the worker's link is
// busy at least bytes / rate + messages * m per iteration. Every worker's message (a chunk) lands on one server's
// downlink for as long (and its sum leaves that server's uplink for as long), so the S servers together are busy at
// least W (bytes / rate + messages * m), and the busiest of them at least the mean, W / S of that. Each message's
// time is rounded to the nanosecond (its bytes' time and m, each up to half a nanosecond short), which the per-message
// term gives up.
double PsNetwork::comm_lower_bound_s(uint64_t bytes, uint64_t messages) const {
  const double m = p_.fair_share ? 0.0 : std::max(0.0, message_s() - 1e-9);
  const double worker = bytes * 8.0 / p_.worker_bps + double(messages) * m;
  const double server = double(p_.workers) / p_.servers * (bytes * 8.0 / p_.server_bps + double(messages) * m);
  return std::max(worker, server);
}

uint64_t PsNetwork::min_messages(uint64_t tensor_bytes) const {
  if (tensor_bytes == 0) return 0;
  return p_.chunk_bytes == 0 ? 1 : (tensor_bytes + p_.chunk_bytes - 1) / p_.chunk_bytes;
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

// Collectives run one at a time, each paying alpha beside its bytes. No collective mixes two iterations' gradients
// (the next backward, which produces the next gradients, follows a forward that waits for every sum of this
// iteration), so an iteration's gradients, any `messages` > 0 of them, take at least one alpha (less the half
// nanosecond the collective's time may round short).
double RingAllreduceNetwork::comm_lower_bound_s(uint64_t bytes, uint64_t messages) const {
  const CostModel c = cost_model();
  return c.beta_s_per_byte * bytes + (messages > 0 ? std::max(0.0, c.alpha_s - 0.5e-9) : 0.0);
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
