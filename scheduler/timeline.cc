#include "scheduler/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <set>
#include <stdexcept>

namespace commsched {
namespace {

constexpr uint64_t kFlushEvery = 512;

void write_all_at(int fd, const std::string& data, int64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, offset + static_cast<int64_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("timeline: cannot write '" + path + "': " + std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
}

void append_us(std::string& out, Nanos ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1000.0);
  out += buf;
}

// Every live Timeline of the process, for start_timeline / stop_timeline (the plugin does not reach into engines).
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::set<Timeline*>& registry() {
  static std::set<Timeline*> all;
  return all;
}

}  // namespace

Timeline::Timeline(const std::string& path, int rank, uint64_t max_events) : rank_(rank), max_events_(max_events) {
  zero_unix_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  if (path != kDeferred) open_locked(path);  // not shared yet: no lock needed
  std::lock_guard lk(registry_mu());
  registry().insert(this);
}

Timeline::~Timeline() {
  {
    std::lock_guard lk(registry_mu());
    registry().erase(this);
  }
  try {
    std::lock_guard lk(mu_);
    close_locked();
  } catch (...) {
    // Destructors must not throw; the file stays valid JSON from the previous flush.
  }
}

std::string Timeline::rank_path(const std::string& path, int rank) {
  const std::string r = std::to_string(rank);
  std::string out = path;
  bool replaced = false;
  for (size_t at = out.find("{rank}"); at != std::string::npos; at = out.find("{rank}", at + r.size())) {
    out.replace(at, 6, r);
    replaced = true;
  }
  if (replaced) return out;
  const size_t slash = out.rfind('/');
  const size_t dot = out.rfind('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  return has_ext ? out.substr(0, dot) + ".rank" + r + out.substr(dot) : out + ".rank" + r;
}

void Timeline::open_locked(const std::string& path) {
  const std::string file = rank_path(path, rank_);
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("timeline: cannot open '" + file + "': " + std::strerror(errno));
  fd_ = fd;
  path_ = file;
  events_ = buffered_ = dropped_ = 0;
  buffer_.clear();
  const std::string pid = std::to_string(rank_);
  std::string head = "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid +
                     ",\"args\":{\"name\":\"commsched rank " + pid + "\"}},\n{\"name\":\"clock_sync\",\"ph\":\"M\",\"pid\":" +
                     pid + ",\"args\":{\"rank\":" + pid + ",\"zero\":\"rendezvous\",\"zero_unix_ns\":" +
                     std::to_string(zero_unix_ns_) + "}}";
  first_ = false;
  end_offset_ = static_cast<int64_t>(head.size());
  write_all_at(fd_, head + "\n]\n", 0, path_);
}

void Timeline::close_locked() {
  if (fd_ < 0) return;
  if (dropped_ > 0) {
    buffer_ += ",\n{\"name\":\"timeline_truncated\",\"ph\":\"M\",\"pid\":" + std::to_string(rank_) +
               ",\"args\":{\"dropped_events\":" + std::to_string(dropped_) + ",\"max_events\":" +
               std::to_string(max_events_) + "}}";
  }
  try {
    flush_locked();
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    path_.clear();
    throw;
  }
  ::close(fd_);
  fd_ = -1;
  path_.clear();
}

std::string Timeline::path() const {
  std::lock_guard lk(mu_);
  return path_;
}

void Timeline::restart(const std::string& path) {
  std::lock_guard lk(mu_);
  close_locked();
  open_locked(path);
}

void Timeline::stop() {
  std::lock_guard lk(mu_);
  close_locked();
}

size_t Timeline::restart_all(const std::string& path) {
  std::lock_guard lk(registry_mu());
  for (Timeline* t : registry()) t->restart(path);
  return registry().size();
}

size_t Timeline::stop_all() {
  std::lock_guard lk(registry_mu());
  for (Timeline* t : registry()) t->stop();
  return registry().size();
}

void Timeline::append_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
}

bool Timeline::admit(uint64_t n) {
  if (fd_ < 0) return false;  // stopped (or deferred): nothing to write to, nothing to count
  if (events_ + n > max_events_) {
    dropped_ += n;
    return false;
  }
  events_ += n;
  buffered_ += n;
  return true;
}

void Timeline::span(std::string_view category, std::string_view name, uint64_t id, Nanos begin, Nanos end,
                    std::string_view args_json) {
  std::lock_guard lk(mu_);
  if (!admit(2)) return;
  for (int phase = 0; phase < 2; ++phase) {
    buffer_ += ",\n{\"name\":\"";
    append_escaped(buffer_, name);
    buffer_ += "\",\"cat\":\"";
    append_escaped(buffer_, category);
    buffer_ += phase == 0 ? "\",\"ph\":\"b\",\"id\":" : "\",\"ph\":\"e\",\"id\":";
    buffer_ += std::to_string(id);
    buffer_ += ",\"pid\":" + std::to_string(rank_) + ",\"tid\":0,\"ts\":";
    append_us(buffer_, phase == 0 ? begin : end);
    if (phase == 0 && !args_json.empty()) {
      buffer_ += ",\"args\":";
      buffer_ += args_json;
    }
    buffer_ += '}';
  }
  if (buffered_ >= kFlushEvery) flush_locked();
}

void Timeline::instant(std::string_view name, Nanos at, std::string_view args_json) {
  std::lock_guard lk(mu_);
  if (!admit(1)) return;
  buffer_ += ",\n{\"name\":\"";
  append_escaped(buffer_, name);
  buffer_ += "\",\"ph\":\"i\",\"s\":\"p\",\"pid\":" + std::to_string(rank_) + ",\"tid\":0,\"ts\":";
  append_us(buffer_, at);
  if (!args_json.empty()) {
    buffer_ += ",\"args\":";
    buffer_ += args_json;
  }
  buffer_ += '}';
  if (buffered_ >= kFlushEvery) flush_locked();
}

void Timeline::flush() {
  std::lock_guard lk(mu_);
  flush_locked();
}

void Timeline::flush_locked() {
  if (buffer_.empty() || fd_ < 0) return;
  // One pwrite replaces the old "\n]\n" tail with the new events plus a new tail: the file is valid before and after.
  buffer_ += "\n]\n";
  write_all_at(fd_, buffer_, end_offset_, path_);
  end_offset_ += static_cast<int64_t>(buffer_.size()) - 3;
  buffer_.clear();
  buffered_ = 0;
}

uint64_t Timeline::dropped() const {
  std::lock_guard lk(mu_);
  return dropped_;
}

}  // namespace commsched
