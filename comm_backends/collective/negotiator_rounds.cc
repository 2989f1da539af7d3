// The negotiator's rounds: what a round waits on and does (reading the wake-up and the peers, rank 0's ordering,
// keep-alive, shutdown, running the ordered groups), done by the negotiator thread's loop or, while a caller waits for
// its groups, by that caller (help_until). Connections and messages are negotiator.cc's; the order's path
// negotiator_order.cc's; a peer's loss, keep-alive and shutdown negotiator_faults.cc's.
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "comm_backends/collective/negotiator.h"
#include "comm_backends/collective/negotiator_detail.h"
#include "scheduler/spin_wait.h"

namespace commsched::collective {
namespace {

using Clock = std::chrono::steady_clock;
using detail::now_ns;
using detail::wake;

// How long after a caller helped the negotiator thread does not spin (callers help again at their next wait).
constexpr int64_t kHelpedLatelyNs = 100'000'000;

// The negotiator whose work this thread is doing in help_until (completed() then needs no wake-up).
thread_local const Negotiator* t_helping = nullptr;

}  // namespace

void Negotiator::completed() {
  if (!coordinator_) return;
  ++completed_groups_;
  // On the negotiator thread itself (a blocking execute) the loop sees the count before it sleeps, and a helping
  // caller wakes it when it stops helping (help_until): no wake-up needed then.
  if (std::this_thread::get_id() != thread_.get_id() && t_helping != this) wake(wake_.get());
}

void Negotiator::run() {
  ::pthread_setname_np(::pthread_self(), "cs-negotiator");  // visible in top -H, perf sched, gdb
  StateLock state(*this);
  try {
    loop(state);
  } catch (const std::exception& e) {
    fail_broken(e);
  }
  run_ready_groups(state);  // already ordered on every rank: run them (the backend fails them fast after a fatal error)
  state.unlock();
  fail_all_pending(Status::Error("negotiator rank " + std::to_string(opts_.rank) + " shut down", Status::Code::cancelled));
  std::vector<Submission> late;
  {
    std::lock_guard lock(mu_);
    if (!dead_) {
      dead_ = true;
      dead_status_ = Status::Error("negotiator rank " + std::to_string(opts_.rank) + " shut down", Status::Code::cancelled);
    }
    late.swap(inbox_);
  }
  join_cv_.notify_all();
  for (const auto& s : late) cb_.fail(s.token, dead_status_);
}

void Negotiator::loop(StateLock& state) {
  std::vector<pollfd> fds;
  std::vector<int> fd_rank;
  while (!finished_) {
    poll_set(fds, fd_rank);
    const int timeout_ms = poll_timeout_ms();
    state.unlock();  // rank 0's submitting threads (and helping callers) may run a step meanwhile
    wait_events(fds, timeout_ms);
    state.lock();
    if (helping_.load() > 0) continue;  // a caller does the rounds now (help_until): the wake-up and the peers are its
    handle_events(state, fds, fd_rank);
  }
}

void Negotiator::poll_set(std::vector<pollfd>& fds, std::vector<int>& fd_rank) const {
  fds.assign(1, pollfd{wake_.get(), POLLIN, 0});
  fd_rank.assign(1, -1);
  for (size_t i = 0; i < peers_.size(); ++i)
    if (peers_[i].fd.valid() && !peers_[i].closed) {
      fds.push_back({peers_[i].fd.get(), POLLIN, 0});
      fd_rank.push_back(static_cast<int>(i));
    }
}

void Negotiator::drain_wake() {
  uint64_t v;
  [[maybe_unused]] const ssize_t n = ::read(wake_.get(), &v, sizeof v);  // non-blocking: nothing there is fine
}

void Negotiator::handle_events(StateLock& state, const std::vector<pollfd>& fds, const std::vector<int>& fd_rank) {
  if (fds[0].revents) drain_wake();
  take_inbox();
  for (size_t i = 1; i < fds.size() && !finished_; ++i)
    if (fds[i].revents) read_peer_guarded(fd_rank[i]);
  if (!coordinator_ && !finished_) throw_if_vouch_error();  // an order read just now may have found one
  if (coordinator_ && !finished_) coordinator_round();
  const auto now = Clock::now();
  if (!finished_) keep_alive(now);
  if (!finished_) progress_shutdown(now);
  // Last: with execute_blocks this runs the collectives; whatever peers sent meanwhile is read (and refreshes
  // their liveness) at the top of the next round, before any silence is judged.
  run_ready_groups(state);
}

void Negotiator::help_until(const std::function<bool()>& done, std::chrono::nanoseconds idle) {
  if (!opts_.execute_blocks || state_owner_.load() == std::this_thread::get_id() || t_helping == this) return;
  ++helping_;
  t_helping = this;
  HelpWait wait;
  auto last_work = Clock::now();
  while (!done()) {
    const HelpResult r = help_round(wait);
    if (r == HelpResult::finished) break;
    const auto now = Clock::now();
    if (r == HelpResult::worked) last_work = now;
    else if (now - last_work >= idle) break;
    // Nothing to do yet: sleep in poll on what brings the next piece (the order from rank 0, a peer's report, a
    // wake-up), not spin. The message wakes this thread at once, ahead of threads that ran meanwhile, and a sleeping
    // caller leaves the cores to its rank's Gloo thread and to the other ranks. collective_bench, 2 ranks, ten
    // alternated runs each, spinning (yield) -> sleeping, ratio to plain Gloo: quiet 4 KiB 1.74 -> 1.50x, 1 MiB
    // 1.35 -> 0.92x; beside builds (load ~9) 4 KiB 1.02 -> 0.21x; with eight nice-10 busy loops too, 4 KiB 1.67 ->
    // 0.56x, 1 MiB 1.81 -> 1.24x.
    else sleep_for_work(wait, idle - (now - last_work));
  }
  t_helping = nullptr;
  helped_at_ns_ = now_ns();
  // The negotiator thread takes over again: it waits on its sockets, and takes the completions told while this
  // caller helped (completed() did not wake it), so rank 0's policy frees their credit even if no other event comes.
  // It may be asleep on either eventfd: on helper_left_ if it saw this caller help, else on wake_.
  if (--helping_ == 0) {
    wake(helper_left_.get());
    wake(wake_.get());
  }
}

Negotiator::HelpResult Negotiator::help_round(HelpWait& wait) {
  wait.fds.clear();
  StateLock state(*this, std::try_to_lock);
  if (!state.owns()) return HelpResult::idle;  // the negotiator thread (or a submitter) is mid-step
  if (finished_) return HelpResult::finished;
  poll_set(help_fds_, help_fd_rank_);
  const bool came = ::poll(help_fds_.data(), help_fds_.size(), 0) > 0;
  const bool worked = came || !ready_groups_.empty() || completed_groups_.load() > 0;
  try {  // every round: the negotiator thread, while a caller helps, takes neither its inbox nor the peers' frames
    handle_events(state, help_fds_, help_fd_rank_);
  } catch (const std::exception& e) {
    fail_broken(e);
  }
  if (!finished_) {
    if (!worked) {
      wait.fds = help_fds_;
      wait.max_ms = poll_timeout_ms();
    }
    return worked ? HelpResult::worked : HelpResult::idle;
  }
  wake(wake_.get());  // what ended the group may have been read here: the negotiator thread winds up
  return HelpResult::finished;
}

void Negotiator::sleep_for_work(HelpWait& wait, std::chrono::nanoseconds left) {
  if (wait.fds.empty() || wait.max_ms == 0) {  // the state was busy, or the coordinator's timer is due
    std::this_thread::yield();
    return;
  }
  const auto ns = std::min<int64_t>(left.count(), int64_t(wait.max_ms) * 1'000'000);
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  for (auto& p : wait.fds) p.revents = 0;
  ::ppoll(wait.fds.data(), wait.fds.size(), &ts, nullptr);  // an error or a signal: the next round looks again
}

void Negotiator::wait_events(std::vector<pollfd>& fds, int timeout_ms) const {
  auto poll_for = [&](int ms) {
    const int rc = ::poll(fds.data(), fds.size(), ms);
    if (rc < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    return rc > 0;
  };
  const auto spin = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(opts_.spin_s));
  // While a caller helps (help_until) it reads the wake-up and the peers: this thread waits on helper_left_ alone,
  // which the last caller writes when it stops helping.
  if (helping_.load() > 0) {  // the caller's rounds also keep the policy's timers and the heartbeats
    pollfd left{helper_left_.get(), POLLIN, 0};
    if (::poll(&left, 1, static_cast<int>(heartbeat_.count() / 2)) > 0) {
      uint64_t v;
      [[maybe_unused]] const ssize_t n = ::read(helper_left_.get(), &v, sizeof v);
    }
    return;
  }
  // Nor does it spin while callers help from step to step: it would share a core with the returning caller and the
  // Gloo thread (collective_bench, quiet, 4 KiB: a tenth of the steps took a 4 ms scheduler tick longer).
  const bool helped_lately = now_ns() - helped_at_ns_.load() < kHelpedLatelyNs;
  const auto spin_for = timeout_ms == 0 || helped_lately ? std::chrono::nanoseconds::zero() : spin;
  if (spin_until_alone([&] { return helping_.load() > 0 || poll_for(0); }, spin_for)) return;
  if (timeout_ms > 0) poll_for(timeout_ms);
}

int Negotiator::poll_timeout_ms() const {
  if (completed_groups_.load() > 0) return 0;  // the policy may dispatch more now
  int64_t ms = heartbeat_.count() / 2;
  if (coordinator_)
    if (const auto at = coordinator_->next_wakeup()) {
      const int64_t left_ns = *at - now_ns();
      ms = std::min<int64_t>(ms, left_ns <= 0 ? 0 : (left_ns + 999'999) / 1'000'000);
    }
  return static_cast<int>(ms);
}

void Negotiator::run_ready_groups(StateLock& state) {
  if (ready_groups_.empty()) return;
  state.unlock();
  std::lock_guard runner(run_mu_);  // another thread may be running earlier groups: they go first
  state.lock();
  while (!ready_groups_.empty()) {
    auto groups = std::move(ready_groups_);
    ready_groups_.clear();
    state.unlock();  // run_mu_ keeps them in order
    for (auto& g : groups) cb_.execute(std::move(g));
    // A caller helping meanwhile may sleep in poll waiting for these very groups (this thread was running them when
    // it began, or another helper was): wake it to look at its done() again, or it sleeps out its idle time.
    if (helping_.load() > (t_helping == this ? 1 : 0)) wake(wake_.get());
    state.lock();
  }
}

}  // namespace commsched::collective
