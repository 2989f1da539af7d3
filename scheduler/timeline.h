// Timeline: Chrome trace-event JSON (a JSON array of events; opens in Perfetto and chrome://tracing).
//
// The file is valid JSON at every moment after construction: events are buffered in memory and each flush writes
// ",<events>\n]" with one pwrite over the previous closing bracket, so a process that dies mid-run leaves a file that
// parses (missing at most the events buffered since the last flush). The number of events is bounded; events past the
// bound are counted and the count is written as a final metadata event on close.
//
// One file per rank: the rank goes into the file name (rank_path). Every file starts with a "clock_sync" metadata
// event: its zero is the engine's start, which is right after the backend's rendezvous, so the files of one run share
// a time base (`commsched trace-merge` puts them on one timeline, a track per rank). The trace can be stopped and
// restarted into another file while the engine runs (stop / restart; the Python plugin's stop_timeline and
// start_timeline); an engine built with the path kDeferred starts with no file until restart().
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "base/types.h"

namespace commsched {

class Timeline {
 public:
  // The path that means "no file yet" (recording starts at restart()).
  static constexpr const char* kDeferred = "commsched:deferred";

  // Opens (truncates) rank_path(path, rank); throws std::runtime_error naming the path when it cannot be written.
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
  // The file this timeline writes (empty when stopped).
  std::string path() const;

  // Finishes the current file (if any) and starts writing rank_path(path, rank) from now on; throws naming the path.
  void restart(const std::string& path);
  // Finishes the current file; later events are discarded until restart().
  void stop();

  // `path` with the rank in the file name: every "{rank}" replaced by the rank, or else ".rank<N>" inserted before
  // the extension ("trace.json" -> "trace.rank0.json"; "trace" -> "trace.rank0").
  static std::string rank_path(const std::string& path, int rank);
  // restart() / stop() on every live Timeline of this process (the engines it runs); returns how many there are.
  static size_t restart_all(const std::string& path);
  static size_t stop_all();

 private:
  bool admit(uint64_t n);  // under mu_
  void flush_locked();
  void open_locked(const std::string& path);   // opens rank_path(path) and writes the metadata head
  void close_locked();                         // writes the truncation note, flushes and closes
  static void append_escaped(std::string& out, std::string_view s);

  std::string path_;
  int rank_;
  uint64_t max_events_;
  int64_t zero_unix_ns_ = 0;  // wall-clock time of ts 0 (recorded for information; merging aligns on ts 0)
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
