#include "comm_backends/collective/wire.h"

namespace commsched::collective {

std::string ByteWriter::take_frame() {
  std::string frame(sizeof(uint32_t), '\0');
  const uint32_t len = static_cast<uint32_t>(buf_.size());
  std::memcpy(frame.data(), &len, sizeof len);
  frame += buf_;
  buf_.clear();
  return frame;
}

void ByteReader::need(size_t n) const {
  if (bytes_.size() - pos_ < n)
    throw std::runtime_error(what_ + ": truncated message (" + std::to_string(bytes_.size()) + " bytes, need " +
                             std::to_string(pos_ + n) + ")");
}

std::string ByteReader::get_string() {
  const uint32_t n = get<uint32_t>();
  need(n);
  std::string s(bytes_.substr(pos_, n));
  pos_ += n;
  return s;
}

bool FrameAssembler::next(std::string& frame, const std::string& what, uint32_t max_bytes) {
  if (buf_.size() - pos_ < sizeof(uint32_t)) return false;
  uint32_t len;
  std::memcpy(&len, buf_.data() + pos_, sizeof len);
  if (len > max_bytes) throw std::runtime_error(what + ": frame of " + std::to_string(len) + " bytes exceeds the limit");
  if (buf_.size() - pos_ - sizeof len < len) return false;
  frame.assign(buf_, pos_ + sizeof len, len);
  pos_ += sizeof len + len;
  // Compact once the consumed prefix dominates, so the buffer does not grow without bound.
  if (pos_ > 4096 && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return true;
}

}  // namespace commsched::collective
