// The worker's side of what the parameter server knows of the other workers (comm_backends/membership.h): Horovod's
// join (every server stands in for a joined worker with zeros) and the servers' lag reports. Reached through
// PsBackend::capabilities(); the I/O thread's part runs from io_main and on_message (ps_backend.cc).
#include <iostream>
#include <utility>

#include "comm_backends/ps/ps_backend.h"

namespace commsched {
using namespace ps;
using control::payload_text;

int PsBackend::join() {
  std::unique_lock lock(mu_);
  if (state_ != State::ready || stopping_)
    throw std::runtime_error("ps backend cannot join: " + (state_ == State::failed ? failure_.message : "it is shut down"));
  join_asked_ = true;
  join_done_ = false;
  lock.unlock();
  transport_->wake();
  lock.lock();
  state_cv_.wait(lock, [&] { return join_done_ || state_ != State::ready || stopping_; });
  if (!join_done_)
    throw std::runtime_error("join failed: " + (state_ == State::failed ? failure_.message : "the ps backend shut down"));
  return join_last_;
}

void PsBackend::send_join_if_asked() {
  {
    std::lock_guard lock(mu_);
    if (!std::exchange(join_asked_, false)) return;
  }
  joined_answers_ = 0;
  for (PeerId id : van_->peers(PeerRole::server)) van_->send(id, header(MsgType::join));
}

void PsBackend::on_joined(int server, const Header& h) {
  std::lock_guard lock(mu_);
  if (server == 0) join_last_ = static_cast<int>(h.aux);  // join() reads it only once join_done_ is set
  if (++joined_answers_ < env_.num_servers) return;
  join_done_ = true;
  state_cv_.notify_all();
}

void PsBackend::on_lags(int server, const Payload* payload) {
  auto lags = decode_stragglers(payload_text(payload), env_.num_workers);
  if (!lags) return fail_all(Status::Error(server_name(server) + " sent a malformed lag report"));
  std::vector<std::string> lines;
  {
    std::lock_guard lock(lags_mu_);
    lines = lags_.report(static_cast<size_t>(server), std::move(*lags), Clock::now());
  }
  for (const std::string& line : lines)
    std::cerr << ("[commsched worker " + std::to_string(env_.rank) + "] " + line + " (reported by " +
                  server_name(server) + ")\n")
              << std::flush;
}

std::vector<Straggler> PsBackend::stragglers() const {
  std::lock_guard lock(lags_mu_);
  return lags_.current(Clock::now());
}

}  // namespace commsched
