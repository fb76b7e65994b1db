#include "melforge/common/timing.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#ifdef MELFORGE_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace melforge {

void StageTimes::add(const std::string& stage, double seconds) {
  auto [it, inserted] = seconds_.try_emplace(stage, 0.0);
  if (inserted) order_.push_back(stage);
  it->second += seconds;
}

double StageTimes::get(const std::string& stage) const {
  auto it = seconds_.find(stage);
  return it == seconds_.end() ? 0.0 : it->second;
}

nlohmann::json StageTimes::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& name : order_) j[name] = seconds_.at(name);
  return j;
}

std::string StageTimes::table(double total_seconds) const {
  std::ostringstream out;
  char line[160];
  std::snprintf(line, sizeof line, "%-22s %12s %8s\n", "stage", "seconds", "share");
  out << line;
  for (const auto& name : order_) {
    const double s = seconds_.at(name);
    std::snprintf(line, sizeof line, "%-22s %12.4f %7.1f%%\n", name.c_str(), s,
                  total_seconds > 0 ? 100.0 * s / total_seconds : 0.0);
    out << line;
  }
  std::snprintf(line, sizeof line, "%-22s %12.4f\n", "total (wall)", total_seconds);
  out << line;
  return out.str();
}

ScopedStage::ScopedStage(StageTimes& times, std::string stage) : times_(times), stage_(std::move(stage)) {
#ifdef MELFORGE_HAVE_NVTX
  nvtxRangePushA(stage_.c_str());
#endif
}

ScopedStage::~ScopedStage() {
#ifdef MELFORGE_HAVE_NVTX
  nvtxRangePop();
#endif
  times_.add(stage_, watch_.seconds());
}

long long peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      long long kb = 0;
      status >> kb;
      return kb * 1024;
    }
    std::string rest;
    std::getline(status, rest);
  }
  return 0;
}

}  // namespace melforge
