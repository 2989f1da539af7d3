// Timeline: Chrome trace-event JSON (a JSON array of events; opens in Perfetto and chrome://tracing).
//
// The file is valid JSON at every moment after construction: events are buffered in memory and each flush writes
// ",<events>\n]" with one pwrite over the previous closing bracket, so a process that dies mid-run leaves a file that
// parses (missing at most the events buffered since the last flush). The number of events is bounded; events past the
// bound are counted and the count is written as a final metadata event on close.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "scheduler/types.h"

namespace commsched {

class Timeline {
 public:
  // Opens (truncates) `path`; throws std::runtime_error naming the path when it cannot be written.
  Timeline(const std::string& path, int rank, uint64_t max_events);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // An async span [begin, end] (nanoseconds since the engine started) on track `category`, joined by id.
  void span(std::string_view category, std::string_view name, uint64_t id, Nanos begin, Nanos end,
            std::string_view args_json = {});
  // An instant event (iteration boundaries, knob changes).
  void instant(std::string_view name, Nanos at, std::string_view args_json = {});
  void flush();
  uint64_t dropped() const;
  const std::string& path() const { return path_; }

 private:
  bool admit(uint64_t n);  // under mu_
  void flush_locked();
  static void append_escaped(std::string& out, std::string_view s);

  std::string path_;
  int rank_;
  uint64_t max_events_;
  int fd_ = -1;
  mutable std::mutex mu_;
  std::string buffer_;        // serialized events not yet written, each preceded by ",\n" except the very first
  uint64_t events_ = 0;       // events admitted so far
  uint64_t buffered_ = 0;     // events in buffer_
  uint64_t dropped_ = 0;
  int64_t end_offset_ = 0;    // file offset of the closing "\n]"
  bool first_ = true;
};

}  // namespace commsched
