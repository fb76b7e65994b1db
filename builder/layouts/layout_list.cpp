// STUB on branch "manifest" so that --layout links; helper "layouts" owns this file and replaces it with the real
// list (one line per layout).
#include <algorithm>
#include <cctype>

#include "layout.h"
#include "melforge/common/errors.h"

namespace melforge::builder::layouts {

const std::vector<Layout>& all_layouts() {
  static const std::vector<Layout> layouts;
  return layouts;
}

const Layout& find_layout(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string names;
  for (const Layout& l : all_layouts()) {
    if (l.name == lower) return l;
    names += (names.empty() ? "" : ", ") + l.name;
  }
  throw InvalidArgument("--layout: unknown layout '" + name + "' (known: " + (names.empty() ? "none" : names) + ")");
}

}  // namespace melforge::builder::layouts
