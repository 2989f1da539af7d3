#include "comm_backends/control/loss_relay.h"

namespace commsched::control {
namespace {
constexpr const char* kReportedBy = " (reported by ";
}  // namespace

std::optional<LossRelay::Verdict> LossRelay::noticed(std::string message, std::optional<Id> culprit,
                                                     const std::vector<Id>& members) {
  return stop(std::move(message), culprit, members);
}

// The reporter knows already. The culprit is known here only by the report's text, not by id: if this node still
// lists it (it has not seen it go), it is told too, which is harmless (a lost peer reads nothing).
std::optional<LossRelay::Verdict> LossRelay::reported(const std::string& text, Id reporter,
                                                      const std::string& reporter_name, const std::vector<Id>& members) {
  return stop(reported_by(text, reporter_name), reporter, members);
}

std::optional<LossRelay::Verdict> LossRelay::stop(std::string message, std::optional<Id> skip,
                                                  const std::vector<Id>& members) {
  if (stopped_) return std::nullopt;
  stopped_ = true;
  Verdict v{std::move(message), {}};
  for (Id m : members)
    if (m != skip) v.tell.push_back(m);
  return v;
}

std::string LossRelay::lost(const std::string& who, const std::string& why) { return who + " lost: " + why; }

std::string LossRelay::reported_by(const std::string& text, const std::string& reporter) {
  if (text.find(kReportedBy) != std::string::npos) return text;
  return text + kReportedBy + reporter + ")";
}

}  // namespace commsched::control
