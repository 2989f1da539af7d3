// A rank's failure path and upkeep: a lost peer named and every other rank told (the loss relay), the group's fatal
// stop, keep-alive and silence judged, the goodbye barrier at shutdown, and rank 0's straggler reports. The
// connections are negotiator.cc's, the rounds negotiator_rounds.cc's, the order's path negotiator_order.cc's.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "comm_backends/collective/negotiator.h"
#include "comm_backends/collective/negotiator_detail.h"

namespace commsched::collective {
namespace {

using Clock = std::chrono::steady_clock;
using detail::now_ns;

}  // namespace

void Negotiator::peer_lost(int rank, const std::string& why) {
  fail_group(Status::Error(control::LossRelay::lost("rank " + std::to_string(rank), why), Status::Code::peer_lost), rank);
}

void Negotiator::fail_group(const Status& st, std::optional<int> culprit) {
  std::optional<control::LossRelay::Id> id;
  if (culprit) id = static_cast<control::LossRelay::Id>(*culprit);
  stop(relay_.noticed(st.message, id, open_peers()), st.code, culprit.value_or(-1));
}

void Negotiator::fail_broken(const std::exception& e) {
  // Malformed input, a broken invariant: the others are told too, rather than finding this rank silent later.
  fail_group(Status::Error("negotiator rank " + std::to_string(opts_.rank) + ": " + e.what()), std::nullopt);
}

void Negotiator::reported(int from, const std::string& text) {
  stop(relay_.reported(text, static_cast<control::LossRelay::Id>(from), "rank " + std::to_string(from), open_peers()),
       Status::Code::peer_lost, -1);
}

void Negotiator::stop(const std::optional<control::LossRelay::Verdict>& verdict, Status::Code code, int culprit) {
  if (!verdict) return;  // this rank has failed already
  const std::string frame = encode_peer_lost(culprit, verdict->message);
  for (const auto r : verdict->tell) {
    Peer& p = peers_[r];
    try {
      std::lock_guard send_lock(send_mu_);  // the heartbeat thread writes to these sockets too
      send_all(p.fd.get(), frame, who(static_cast<int>(r)));
    } catch (const std::exception&) {
      p.closed = true;  // it learns from the closed connection instead
    }
  }
  go_fatal(Status::Error(verdict->message, code));
}

std::vector<control::LossRelay::Id> Negotiator::open_peers() const {
  std::vector<control::LossRelay::Id> out;
  for (size_t r = coordinator_ ? 1 : 0; r < peers_.size(); ++r)
    if (peers_[r].fd.valid() && !peers_[r].closed) out.push_back(r);
  return out;
}

// Once, from stop(): the relay lets the first failure through only.
void Negotiator::go_fatal(const Status& st) {
  {
    std::lock_guard lock(mu_);
    dead_ = true;
    dead_status_ = st;
  }
  join_cv_.notify_all();
  if (cb_.fatal) cb_.fatal(st);
  fail_all_pending(st);
  std::vector<Submission> late;
  {
    std::lock_guard lock(mu_);
    late.swap(inbox_);
  }
  for (const auto& s : late) cb_.fail(s.token, st);
  finished_ = true;
}

void Negotiator::judge_peers() {
  if (state_owner_.load() == std::this_thread::get_id()) return;
  // A rank's death reaches the others through rank 0 (which sees its socket end, or its silence) a little after their
  // transport may have seen it: wait up to a heartbeat interval for that verdict before the transport's error stands.
  const auto deadline = Clock::now() + heartbeat_;
  StateLock state(*this);
  try {
    std::vector<pollfd> fds;
    std::vector<int> fd_rank;
    while (!finished_) {
      read_waiting_peers();
      if (!finished_) keep_alive(Clock::now());
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (finished_ || left <= 0) break;
      poll_set(fds, fd_rank);
      state.unlock();  // the negotiator thread or a helping caller may read the verdict meanwhile
      ::poll(fds.data() + 1, fds.size() - 1, static_cast<int>(left));  // [0] is the wake-up: only the peers
      state.lock();
    }
  } catch (const std::exception& e) {
    fail_broken(e);
  }
}

void Negotiator::fail_all_pending(const Status& st) {
  std::unordered_map<Slot, Local, SlotHash> pending;
  std::deque<OrderedAhead> ahead;
  {
    std::lock_guard lock(mu_);
    pending.swap(pending_);
    ahead.swap(ordered_ahead_);  // ordered, but waiting for submissions that can no longer be run with the others
    awaited_.clear();
    ordered_failures_.clear();  // nothing runs any more to fail for these reasons
    reasons_changed_locked();
  }
  for (const auto& [slot, local] : pending) cb_.fail(local.token, st);
  for (const OrderedAhead& g : ahead)
    for (size_t i = 0; i < g.tokens.size(); ++i)
      if (g.have[i]) cb_.fail(g.tokens[i], st);
}

void Negotiator::keep_alive(Clock::time_point now) {
  if (now_ns() - last_sent_ns_.load() >= std::chrono::nanoseconds(heartbeat_).count()) {
    const std::string hb = encode_simple(MsgType::heartbeat);
    for (size_t r = coordinator_ ? 1 : 0; r < peers_.size() && !finished_; ++r)
      if (peers_[r].fd.valid() && !peers_[r].closed) send_to(static_cast<int>(r), hb);
    last_sent_ns_ = now_ns();
  }
  if (coordinator_ && now >= next_lag_report_) {
    report_lags(now);
    check_stalls();
    next_lag_report_ = now + heartbeat_;
  }
  if (auto loss = live_.check(now); loss && !finished_)
    peer_lost(static_cast<int>(loss->peer), loss->explain([](Liveness::Id r) { return "rank " + std::to_string(r); }));
}

// The barrier is passed when every awaited goodbye has come (rank 0: every rank's bye; elsewhere: rank 0's all_bye
// or, after this rank's bye, the end of its connection), or after timeout_s of waiting.
void Negotiator::progress_shutdown(Clock::time_point now) {
  if (!bye_sent_ || !bye_.passed(now)) return;
  if (coordinator_) {
    bye_.leave();
    const std::string frame = encode_simple(MsgType::all_bye);
    for (int r = 1; r < opts_.size; ++r)
      if (!peers_[r].closed) {
        try {
          std::lock_guard send_lock(send_mu_);
          send_all(peers_[r].fd.get(), frame, who(r));
        } catch (const std::exception&) {
        }
      }
  }
  finished_ = true;
}

void Negotiator::note_ready(int rank, const std::vector<ReadyReport>& reports) {
  uint64_t round = 0;
  for (const ReadyReport& r : reports) round = std::max(round, r.round);
  if (!reports.empty()) lag_->pushed(static_cast<uint32_t>(rank), round, Clock::now());
}

void Negotiator::report_lags(Clock::time_point now) {
  std::vector<Straggler> lags;
  for (const LagTracker::Lag& l : lag_->laggards(now, kStragglerReportS))
    lags.push_back(Straggler{static_cast<int>(l.worker), l.lead - l.iteration, l.seconds});
  if (lags.empty() && !lags_reported_) return;
  lags_reported_ = !lags.empty();
  const std::string frame = encode_lags(encode_stragglers(lags));
  for (int r = 1; r < opts_.size && !finished_; ++r)
    if (peers_[r].fd.valid() && !peers_[r].closed) send_to(r, frame);
  heard_lags(std::move(lags));
}

void Negotiator::check_stalls() {
  if (stall_watch_.min_wait_s() <= 0) return;
  const int64_t now = now_ns();
  const double wait_s = stall_watch_.min_wait_s();  // saturated: a duration past int64 nanoseconds means never
  const std::vector<StalledTask> stalls =
      coordinator_->stalled(now, wait_s >= 9e9 ? INT64_MAX : static_cast<int64_t>(wait_s * 1e9));
  if (stalls.empty()) return;
  if (stall_watch_.log_due(double(now) / 1e9, double(stalls.front().waited) / 1e9))
    std::fprintf(stderr, "[commsched negotiator rank 0] stalled: %s. %s\n", describe_stalls(stalls).c_str(),
                 stall_watch_.advice().c_str());
  GlobalOrderOutput out;
  for (const StalledTask& t : stalls)
    if (stall_watch_.fails(double(t.waited) / 1e9))
      coordinator_->fail_stalled(t.key, "stalled: " + describe_stalls({t}) + "; failed after COMMSCHED_STALL_SHUTDOWN",
                                 out);
  publish(out);
}

void Negotiator::heard_lags(std::vector<Straggler> lags) {
  std::vector<std::string> lines;
  {
    std::lock_guard lock(lags_mu_);
    lines = lags_.report(0, std::move(lags), Clock::now());
  }
  for (const std::string& line : lines)
    std::fprintf(stderr, "[commsched negotiator rank %d] %s (as rank 0 sees it)\n", opts_.rank, line.c_str());
}

std::vector<Straggler> Negotiator::stragglers() const {
  std::lock_guard lock(lags_mu_);
  return lags_.current(Clock::now());
}

}  // namespace commsched::collective
