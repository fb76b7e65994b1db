#include <string>

#include "layout.h"
#include "layout_util.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace melforge::builder::layouts {

Layout esc50_layout();
Layout urbansound8k_layout();
Layout speechcommands_layout();
Layout fsd50k_layout();
Layout voxceleb1_layout();
Layout librispeech_layout();

const std::vector<Layout>& all_layouts() {
  static const std::vector<Layout> layouts{esc50_layout(),    urbansound8k_layout(), speechcommands_layout(),
                                           fsd50k_layout(),   voxceleb1_layout(),    librispeech_layout()};
  return layouts;
}

const Layout& find_layout(const std::string& name) {
  const std::string wanted = lower(trim(name));
  std::string names;
  for (const auto& layout : all_layouts()) {
    if (layout.name == wanted) return layout;
    names += (names.empty() ? "" : ", ") + layout.name;
  }
  throw InvalidArgument("--layout '" + utf8::for_terminal(name) + "' is not a known dataset layout; use one of: " +
                        names);
}

}  // namespace melforge::builder::layouts
