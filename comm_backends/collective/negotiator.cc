#include "comm_backends/collective/negotiator.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <cerrno>
#include <cstdio>
#include <stdexcept>

#include "comm_backends/collective/link_auth.h"
#include "comm_backends/collective/negotiator_detail.h"
#include "comm_backends/control/roster.h"
#include "scheduler/spin_wait.h"

namespace commsched::collective {
namespace {

using Clock = std::chrono::steady_clock;
using detail::now_ns;
using detail::wake;

std::chrono::milliseconds seconds_to_ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

// Groups rank 0 orders ahead of its own progress (GlobalOrder::limit_groups_ahead): the running one and the next.
constexpr size_t kGroupsAhead = 2;

}  // namespace

Negotiator::Negotiator(NegotiatorOptions opts, control::Store& store, NegotiatorCallbacks callbacks)
    : opts_(std::move(opts)), cb_(std::move(callbacks)), live_(opts_.timeout_s, {}),
      order_inbox_([this] {
        if (opts_.rank == 0) wake(wake_.get());  // only rank 0's thread takes them (coordinator_round)
      }, [this](bool backward) { mark(backward); }) {
  if (opts_.size < 1 || opts_.rank < 0 || opts_.rank >= opts_.size)
    throw std::invalid_argument("negotiator: rank " + std::to_string(opts_.rank) + " is outside [0, " +
                                std::to_string(opts_.size) + ")");
  // Heartbeats several times per timeout, so one late packet never looks like a death.
  heartbeat_ = heartbeat_interval(opts_.timeout_s);
  stall_watch_ = StallWatch(opts_.stall);
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  helper_left_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid() || !helper_left_.valid()) throw std::runtime_error("negotiator: eventfd failed");
  const auto deadline = Clock::now() + seconds_to_ms(opts_.join_timeout_s);
  if (opts_.rank == 0) {
    coordinator_ = std::make_unique<GlobalOrder>(opts_.size);  // its policy comes through order_inbox_
    lag_.emplace(opts_.size);
    coordinator_->limit_groups_ahead(kGroupsAhead);
    coordinator_->set_vouching(opts_.vouch);
    coordinator_->set_auto_fusion(opts_.auto_fusion_bytes);
    coordinator_->set_knobs(opts_.knobs);
    join_as_coordinator(store, deadline);
  } else {
    join_as_worker(store, deadline);
  }
  const auto now = Clock::now();
  for (size_t r = coordinator_ ? 1 : 0; r < peers_.size(); ++r)
    if (peers_[r].fd.valid()) {
      live_.watch(r, now);
      bye_.await(r);
    }
  last_sent_ns_ = now_ns();
  thread_ = std::thread([this] { run(); });
  if (opts_.execute_blocks && opts_.size > 1) heartbeat_thread_ = std::thread([this] { heartbeat_loop(); });
}

Negotiator::~Negotiator() {
  shutdown();
}

std::string Negotiator::who(int rank) const {
  return "negotiator rank " + std::to_string(opts_.rank) + "/" + std::to_string(opts_.size) + ": rank " + std::to_string(rank);
}

void Negotiator::join_as_coordinator(control::Store& store, Clock::time_point deadline) {
  peers_.resize(opts_.size);
  if (opts_.size == 1) return;
  Fd listener = listen_tcp(opts_.host, 0);
  store.set(opts_.key_prefix + "coordinator", opts_.host + ":" + std::to_string(bound_port(listener.get())));
  // The PS control plane's admission rule: each rank once, in range (every rank is a "worker" of the group).
  control::Roster roster;
  control::Roster::Id accepted = 0;  // connections, numbered as they come
  LinkAuth auth(opts_.secret, "negotiation", "negotiator rank 0");  // logs and notes strangers
  roster.expect(control::PeerRole::worker, 1, static_cast<uint32_t>(opts_.size - 1));
  while (!roster.complete()) {
    if (!wait_readable(listener.get(), deadline)) {
      std::string missing;
      for (const control::Roster::Member& m : roster.missing()) missing += (missing.empty() ? "" : ", ") + std::to_string(m.rank);
      throw std::runtime_error("negotiator rank 0: ranks " + missing + " did not join within " +
                               std::to_string(opts_.join_timeout_s) + " s" + auth.refusals());
    }
    Fd fd = accept_tcp(listener.get());
    if (!fd.valid()) continue;
    tune_control_socket(fd.get(), opts_.timeout_s);
    if (!auth.admit(fd.get(), deadline)) continue;
    const std::string frame = recv_frame(fd.get(), "negotiator rank 0: joining peer", deadline);
    ByteReader r(frame, "hello");  // reads through a view: the frame must outlive it
    if (read_type(r) != MsgType::hello) throw std::runtime_error("negotiator rank 0: a joining peer did not say hello");
    const int rank = r.get<int32_t>();
    const int size = r.get<int32_t>();
    std::optional<std::string> refused;
    if (size != opts_.size) refused = "this group has " + std::to_string(opts_.size) + " ranks";
    else if (rank < 0) refused = "negative rank";
    else refused = roster.admit(++accepted, {control::PeerRole::worker, static_cast<uint32_t>(rank)});
    if (refused)
      throw std::runtime_error("negotiator rank 0: a peer joined as rank " + std::to_string(rank) + " of " +
                               std::to_string(size) + " and was refused: " + *refused +
                               " (duplicate rank or mismatched COMMSCHED_NUM_WORKERS?)");
    peers_[rank].fd = std::move(fd);
  }
  // Everyone is connected: release the workers together.
  for (int r = 1; r < opts_.size; ++r) send_all(peers_[r].fd.get(), encode_simple(MsgType::welcome), who(r));
}

void Negotiator::join_as_worker(control::Store& store, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  const std::string addr = store.get(opts_.key_prefix + "coordinator", left);
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("negotiator: bad coordinator address '" + addr + "' in the store");
  peers_.resize(1);
  peers_[0].fd = connect_tcp(addr.substr(0, colon), std::stoi(addr.substr(colon + 1)), deadline);
  tune_control_socket(peers_[0].fd.get(), opts_.timeout_s);
  LinkAuth(opts_.secret, "negotiation").prove(peers_[0].fd.get(), deadline, who(0) + " (coordinator)");
  send_all(peers_[0].fd.get(), encode_hello(opts_.rank, opts_.size), who(0));
  const std::string frame = recv_frame(peers_[0].fd.get(), who(0) + " (coordinator) during join", deadline);
  if (frame.empty() || frame[0] != static_cast<char>(MsgType::welcome))  // a challenge (0): we have no secret
    throw std::runtime_error(who(0) + (frame.size() && frame[0] == 0 ? std::string(" (coordinator) ") + kNeedsSecret
                                                                      : std::string(": expected welcome during join")));
}

void Negotiator::send_to_coordinator_async(const std::string& frame) {
  std::lock_guard send_lock(send_mu_);
  try {
    send_all(peers_[0].fd.get(), frame, who(0) + " (coordinator)");
    last_sent_ns_ = now_ns();
  } catch (const std::exception& e) {
    if (async_send_error_.empty()) async_send_error_ = e.what();
    wake(wake_.get());
  }
}

void Negotiator::heartbeat_loop() {
  const std::string hb = encode_simple(MsgType::heartbeat);
  std::unique_lock lock(hb_mu_);
  while (!hb_cv_.wait_for(lock, heartbeat_ / 2, [&] { return hb_stop_; })) {
    if (now_ns() - last_sent_ns_.load() < std::chrono::nanoseconds(heartbeat_).count()) continue;
    lock.unlock();
    {
      std::lock_guard state(mu_);
      if (dead_) {
      } else if (!coordinator_) {
        send_to_coordinator_async(hb);
      } else {
        // A failed send is not judged here: the negotiator thread sees the closed connection when it reads.
        std::lock_guard send_lock(send_mu_);
        for (size_t r = 1; r < peers_.size(); ++r) {
          try {
            send_all(peers_[r].fd.get(), hb, who(static_cast<int>(r)));
          } catch (const std::exception&) {
          }
        }
        last_sent_ns_ = now_ns();
      }
    }
    lock.lock();
  }
}

void Negotiator::shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake(wake_.get());
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard lock(hb_mu_);
    hb_stop_ = true;
  }
  hb_cv_.notify_all();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

int Negotiator::join() {
  std::unique_lock lock(mu_);
  if (dead_ || stopping_)
    throw std::runtime_error("join: " + (dead_ ? dead_status_.message : std::string("the negotiator is shutting down")));
  if (opts_.size == 1) return 0;
  joined_ = join_asked_ = true;
  join_done_ = false;
  lock.unlock();
  wake(wake_.get());
  lock.lock();
  join_cv_.wait(lock, [&] { return join_done_ || dead_ || stopping_; });
  if (!join_done_)
    throw std::runtime_error("join failed: " + (dead_ ? dead_status_.message : std::string("the negotiator shut down")));
  return join_last_;
}

void Negotiator::finish_join(int last) {
  std::lock_guard lock(mu_);
  joined_ = false;
  join_done_ = true;
  join_last_ = last;
  join_cv_.notify_all();
}

NegotiatorStats Negotiator::stats() const {
  std::lock_guard lock(mu_);
  return {submitted_.load(), cached_reports_.load(), orders_.load(), groups_.load(), vouched_.load(),
          ordered_failures_.size()};
}

void Negotiator::take_inbox() {
  std::vector<Submission> subs;
  std::vector<std::pair<uint64_t, Status>> failed;
  std::vector<ReadyReport> reports;
  std::vector<IterationMark> marks;
  std::string send_error, vouch_error;
  bool stopping, join_now;
  {
    std::lock_guard lock(mu_);
    subs.swap(inbox_);  // rank 0's own submissions (other ranks report from the submitting thread)
    stopping = stopping_;
    join_now = std::exchange(join_asked_, false);
    // Each mark counts the reports of the submissions before it (IterationMark::after).
    size_t begin = 0;
    for (const auto& [at, backward] : inbox_marks_) {
      for (auto& rep : reports_locked(std::span(subs).subspan(begin, at - begin), failed)) reports.push_back(std::move(rep));
      marks.push_back({backward, submitted_.load()});
      begin = at;
    }
    inbox_marks_.clear();
    for (auto& rep : reports_locked(std::span(subs).subspan(begin), failed)) reports.push_back(std::move(rep));
    send_error.swap(async_send_error_);
    // Groups rank 0 ordered ahead of this rank's submissions (it vouched): those now complete run, in order.
    if (joined_) stand_in_awaited_locked();
    promote_ahead_locked();
    vouch_error = vouch_error_;
  }
  for (const auto& [token, st] : failed) cb_.fail(token, st);
  if (!vouch_error.empty()) throw std::runtime_error(vouch_error);  // see throw_if_vouch_error
  if (!send_error.empty() && !finished_) {
    peer_lost(0, send_error);
    return;
  }
  if (!reports.empty() && coordinator_) {
    GlobalOrderOutput out;
    note_ready(0, reports);
    coordinator_->on_ready(0, reports, out, now_ns());
    publish(out);
  } else if (!reports.empty()) {
    send_to(0, encode_ready(reports));
  }
  for (const IterationMark& m : marks) {  // after the reports they count
    if (coordinator_) coordinator_->on_mark(0, m);
    else send_to(0, encode_mark(m));
  }
  if (join_now && coordinator_) {  // after this rank's reports: they are not stood in for
    GlobalOrderOutput out;
    lag_->forget(0);
    coordinator_->on_join(0, out);
    publish(out);
  } else if (join_now) {
    send_to(0, encode_simple(MsgType::join));
  }
  if (stopping && !bye_sent_) {
    bye_sent_ = true;
    bye_.wait_until(Clock::now() + seconds_to_ms(opts_.timeout_s));
    if (coordinator_) {  // rank 0 says its own goodbye (all_bye) once the others have said theirs
      GlobalOrderOutput out;
      coordinator_->on_bye(0, out);
      publish(out);
    } else {
      bye_.leave();
      send_to(0, encode_simple(MsgType::bye));
    }
  }
}

void Negotiator::read_peer_guarded(int rank) {
  try {
    read_peer(rank);
  } catch (const std::exception& e) {  // the sender's fault: it is named first, the others are told
    fail_group(Status::Error("rank " + std::to_string(rank) + " sent a malformed message: " + e.what()), rank);
  }
}

void Negotiator::read_waiting_peers() {
  std::vector<pollfd> fds;
  std::vector<int> ranks;
  for (size_t r = 0; r < peers_.size(); ++r)  // rank 0's entry 0 is unused (no socket)
    if (peers_[r].fd.valid() && !peers_[r].closed) {
      fds.push_back({peers_[r].fd.get(), POLLIN, 0});
      ranks.push_back(static_cast<int>(r));
    }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (size_t i = 0; i < fds.size() && !finished_; ++i)
    if (fds[i].revents) read_peer_guarded(ranks[i]);
}

void Negotiator::read_peer(int rank) {
  Peer& p = peers_[rank];
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(p.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      live_.heard(static_cast<Liveness::Id>(rank), Clock::now());
      p.in.append(buf, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof buf) break;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    const std::string why = n == 0 ? "closed the connection (process exited or was killed)"
                                   : std::string("connection failed: ") + std::strerror(errno);
    // Frames that arrived before the close still count (a PEER_LOST naming the real culprit, say).
    std::string frame;
    while (!finished_ && p.in.next(frame, who(rank))) handle_frame(rank, frame);
    p.closed = true;
    const bool expected = bye_.ended(static_cast<control::GoodbyeBarrier::Id>(rank));
    live_.forget(static_cast<Liveness::Id>(rank));
    if (!expected && !finished_) peer_lost(coordinator_ ? rank : 0, why);
    return;
  }
  std::string frame;
  while (!finished_ && p.in.next(frame, who(rank))) handle_frame(rank, frame);
}

void Negotiator::handle_frame(int from, const std::string& frame) {
  ByteReader r(frame, who(from));
  const MsgType type = read_type(r);
  if (coordinator_) coordinator_message(from, type, r);
  else worker_message(type, r);
}

void Negotiator::coordinator_message(int from, MsgType type, ByteReader& r) {
  GlobalOrderOutput out;
  switch (type) {
    case MsgType::ready: {
      const auto reports = decode_ready(r);
      note_ready(from, reports);
      if (!relay_.stopped()) coordinator_->on_ready(from, reports, out, now_ns());
      break;
    }
    case MsgType::heartbeat: break;
    case MsgType::bye:
      if (bye_.said_bye(static_cast<control::GoodbyeBarrier::Id>(from))) live_.forget(static_cast<Liveness::Id>(from));
      coordinator_->on_bye(from, out);
      break;
    case MsgType::mark: {
      const IterationMark m = decode_mark(r);
      if (!relay_.stopped()) coordinator_->on_mark(from, m);
      break;
    }
    case MsgType::join:
      lag_->forget(static_cast<uint32_t>(from));
      if (!relay_.stopped()) coordinator_->on_join(from, out);
      break;
    case MsgType::peer_lost:  // a rank failed: rank 0 passes it on to the others
      (void)r.get<int32_t>();
      reported(from, r.get_string());
      break;
    default: throw std::runtime_error(who(from) + " sent an unexpected message type " + std::to_string(int(type)));
  }
  publish(out);
}

void Negotiator::worker_message(MsgType type, ByteReader& r) {
  switch (type) {
    case MsgType::order: apply_order(decode_order(r)); break;
    case MsgType::error: apply_error(decode_error(r)); break;
    case MsgType::peer_lost:
      (void)r.get<int32_t>();  // the culprit's rank (-1: none); the message names it
      reported(0, r.get_string());
      break;
    case MsgType::heartbeat: break;
    case MsgType::all_bye:  // rank 0's goodbye ends the group, whether or not this rank is shutting down
      bye_.said_bye(0);
      finished_ = true;
      break;
    case MsgType::joined: finish_join(r.get<int32_t>()); break;
    case MsgType::lags: {
      auto lags = decode_stragglers(r.get_string(), opts_.size);
      if (!lags) throw std::runtime_error(who(0) + " (coordinator) sent a malformed lag report");
      heard_lags(std::move(*lags));
      break;
    }
    default: throw std::runtime_error(who(0) + " (coordinator) sent an unexpected message type " + std::to_string(int(type)));
  }
}

void Negotiator::send_to(int rank, const std::string& frame) {
  Peer& p = peers_[rank];
  try {
    std::lock_guard send_lock(send_mu_);
    send_all(p.fd.get(), frame, who(coordinator_ ? rank : 0));
  } catch (const std::exception& ex) {
    p.closed = true;
    peer_lost(coordinator_ ? rank : 0, ex.what());
    return;
  }
  last_sent_ns_ = now_ns();
}

}  // namespace commsched::collective
