#include "simulator/flow_net.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace commsched::sim {

int FlowNet::add_link(double bps) {
  if (!(bps > 0)) throw std::invalid_argument("FlowNet: a link needs a positive rate");
  links_.push_back({bps / 8e9});
  return static_cast<int>(links_.size() - 1);
}

int FlowNet::add_connection(int up, int down) {
  const int n = static_cast<int>(links_.size());
  if (up < 0 || up >= n || down < 0 || down >= n || up == down)
    throw std::invalid_argument("FlowNet: a connection joins two different existing links");
  conns_.push_back({up, down, {}, 0});
  return static_cast<int>(conns_.size() - 1);
}

void FlowNet::send(int conn, uint64_t bytes, Nanos latency, std::function<void()> arrived) {
  advance();  // the rates so far apply up to now, before the new message changes them
  Connection& c = conns_.at(size_t(conn));
  c.queue.push_back({double(bytes), latency, std::move(arrived)});
  if (c.queue.size() == 1) active_.push_back(conn);
  finish_done();  // an acknowledgement on an idle connection leaves at once
  reallocate();
  schedule();
}

Nanos FlowNet::busy(int link) const {
  const LinkState& l = links_.at(size_t(link));
  return static_cast<Nanos>(std::llround(l.carried / l.capacity));
}

void FlowNet::advance() {
  const double dt = double(loop_.now() - updated_);
  updated_ = loop_.now();
  if (dt <= 0) return;
  for (int id : active_) {
    Connection& c = conns_[size_t(id)];
    Message& m = c.queue.front();
    const double moved = std::min(m.left, c.rate * dt);
    m.left -= moved;
    links_[size_t(c.up)].carried += moved;
    links_[size_t(c.down)].carried += moved;
  }
}

void FlowNet::finish_done() {
  std::vector<int> still;
  still.reserve(active_.size());
  for (int id : active_) {
    Connection& c = conns_[size_t(id)];
    while (!c.queue.empty() && c.queue.front().left <= 1e-6) {
      Message& m = c.queue.front();
      loop_.at(loop_.now() + m.latency, std::move(m.arrived));
      c.queue.pop_front();
    }
    if (!c.queue.empty()) still.push_back(id);
  }
  active_ = std::move(still);
}

void FlowNet::reallocate() {
  // Progressive filling: the link whose capacity left, shared equally among its flows not yet fixed, gives the least
  // share is the bottleneck of those flows; they get that share, and the other links they cross lose it.
  std::vector<double> left(links_.size());
  std::vector<int> flows(links_.size(), 0);
  for (size_t l = 0; l < links_.size(); ++l) left[l] = links_[l].capacity;
  for (int id : active_) {
    ++flows[size_t(conns_[size_t(id)].up)];
    ++flows[size_t(conns_[size_t(id)].down)];
  }
  std::vector<bool> fixed(active_.size(), false);
  for (size_t remaining = active_.size(); remaining > 0;) {
    size_t bottleneck = 0;
    double share = std::numeric_limits<double>::infinity();
    for (size_t l = 0; l < links_.size(); ++l)
      if (flows[l] > 0 && left[l] / flows[l] < share) share = left[l] / flows[l], bottleneck = l;
    share = std::max(share, 0.0);
    for (size_t i = 0; i < active_.size(); ++i) {
      Connection& c = conns_[size_t(active_[i])];
      if (fixed[i] || (size_t(c.up) != bottleneck && size_t(c.down) != bottleneck)) continue;
      c.rate = share;
      fixed[i] = true;
      --remaining;
      for (int l : {c.up, c.down}) {
        left[size_t(l)] -= share;
        --flows[size_t(l)];
      }
    }
  }
}

void FlowNet::schedule() {
  ++generation_;
  Nanos soonest = -1;
  for (int id : active_) {
    const Connection& c = conns_[size_t(id)];
    if (c.rate <= 0) continue;  // starved until another flow finishes (progressive filling gives every flow > 0)
    // At least 1 ns, so that the event always moves time (and bytes) on.
    const Nanos t = std::max<Nanos>(1, static_cast<Nanos>(std::ceil(c.queue.front().left / c.rate)));
    if (soonest < 0 || t < soonest) soonest = t;
  }
  if (soonest < 0) return;
  loop_.at(loop_.now() + soonest, [this, g = generation_] { on_event(g); });
}

void FlowNet::on_event(uint64_t generation) {
  if (generation != generation_) return;  // the rates changed since this was scheduled
  advance();
  finish_done();
  reallocate();
  schedule();
}

}  // namespace commsched::sim
