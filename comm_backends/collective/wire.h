// Byte encoding for the negotiator's and the store's control messages: little-endian fixed-width fields, frames
// prefixed by a 32-bit length. Every read is bounds-checked; a malformed frame throws, never reads out of bounds.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "comm_backends/control/socket.h"

namespace commsched::collective {

// Frames travel over the control plane's one socket helper (control/socket.h); the collective links name it so.
using control::accept_tcp;
using control::bound_port;
using control::connect_tcp;
using control::Fd;
using control::kMaxFrameBytes;
using control::listen_tcp;
using control::recv_exact;
using control::recv_frame;
using control::send_all;
using control::set_nonblocking;
using control::set_receive_timeout;
using control::tune_control_socket;
using control::wait_readable;

class ByteWriter {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = buf_.size();
    buf_.resize(at + sizeof(T));
    std::memcpy(buf_.data() + at, &v, sizeof(T));  // x86-64 and aarch64 are little-endian; the wire is too
  }
  void put_string(std::string_view s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    buf_.append(s);
  }
  // Wraps the bytes written so far in a frame (length prefix) and returns it; the writer is left empty.
  std::string take_frame();
  size_t size() const { return buf_.size(); }

 private:
  std::string buf_;
};

class ByteReader {
 public:
  ByteReader(std::string_view bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}
  // A view of a temporary would dangle at the end of the declaration (ASan found two): name the frame first.
  ByteReader(std::string&& bytes, std::string what) = delete;
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string get_string();
  bool done() const { return pos_ == bytes_.size(); }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  void need(size_t n) const;
  std::string_view bytes_;
  size_t pos_ = 0;
  std::string what_;
};

// Accumulates bytes from a non-blocking socket and yields complete frames.
class FrameAssembler {
 public:
  void append(const char* data, size_t n) { buf_.append(data, n); }
  // Moves the next complete frame's payload into `frame`; false when none is complete yet. Throws on a frame longer
  // than `max_bytes` (announced in its header: nothing of it is awaited).
  bool next(std::string& frame, const std::string& what, uint32_t max_bytes = kMaxFrameBytes);

 private:
  std::string buf_;
  size_t pos_ = 0;
};

}  // namespace commsched::collective
