#include "comm_backends/straggler.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <sstream>

namespace commsched {

std::string encode_stragglers(const std::vector<Straggler>& lags) {
  std::string out;
  char line[96];
  for (const Straggler& s : lags) {
    std::snprintf(line, sizeof line, "%d %llu %.3f\n", s.rank, static_cast<unsigned long long>(s.iterations), s.seconds);
    out += line;
  }
  return out;
}

namespace {

bool parse_count(const std::string& text, uint64_t& out) {
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), out);
  return err == std::errc{} && end == text.data() + text.size();
}

}  // namespace

std::optional<std::vector<Straggler>> decode_stragglers(std::string_view text, int ranks) {
  std::vector<Straggler> out;
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    Straggler s;
    std::string iterations, rest;
    // The count is read as text: a stream extracts "-1" into an unsigned as 2^64-1 instead of refusing it.
    if (!(fields >> s.rank >> iterations >> s.seconds) || (fields >> rest) || s.rank < 0 || s.rank >= ranks ||
        !(s.seconds >= 0) || !parse_count(iterations, s.iterations))
      return std::nullopt;
    out.push_back(s);
  }
  return out;
}

StragglerBoard::StragglerBoard(size_t sources, double warn_s, std::chrono::seconds repeat, double keep_s)
    : by_source_(sources), warn_s_(warn_s), repeat_(repeat), keep_s_(keep_s) {}

std::vector<std::string> StragglerBoard::report(size_t source, std::vector<Straggler> lags, Clock::time_point now) {
  if (source >= by_source_.size()) return {};
  auto& heard = by_source_[source];
  for (const Straggler& s : lags) {
    auto h = std::find_if(heard.begin(), heard.end(), [&](const Heard& e) { return e.lag.rank == s.rank; });
    if (h == heard.end()) heard.push_back(Heard{s, now});
    else *h = Heard{s, now};
  }
  std::vector<std::string> lines;
  for (const Straggler& s : lags) {
    if (s.seconds < warn_s_) continue;
    auto w = std::find_if(warned_.begin(), warned_.end(), [&](const auto& e) { return e.first == s.rank; });
    if (w != warned_.end() && now - w->second < repeat_) continue;
    if (w == warned_.end()) warned_.emplace_back(s.rank, now);
    else w->second = now;
    char line[160];
    std::snprintf(line, sizeof line, "rank %d lags: %llu iteration(s) behind the furthest, for %.2f s", s.rank,
                  static_cast<unsigned long long>(s.iterations), s.seconds);
    lines.emplace_back(line);
  }
  return lines;
}

std::vector<Straggler> StragglerBoard::current(Clock::time_point now) const {
  std::vector<Straggler> out;
  for (const auto& heard : by_source_)
    for (const Heard& h : heard) {
      if (std::chrono::duration<double>(now - h.at).count() > keep_s_) continue;
      const Straggler& s = h.lag;
      auto it = std::find_if(out.begin(), out.end(), [&](const Straggler& o) { return o.rank == s.rank; });
      if (it == out.end()) out.push_back(s);
      else *it = Straggler{s.rank, std::max(it->iterations, s.iterations), std::max(it->seconds, s.seconds)};
    }
  std::sort(out.begin(), out.end(), [](const Straggler& a, const Straggler& b) { return a.seconds > b.seconds; });
  return out;
}

}  // namespace commsched
