#pragma once
/// Dataset layouts (`melforge-build --layout NAME --input ROOT`): each public dataset's own files read exactly as
/// distributed, with its protocol (splits, folds, groups, class order, noise bank, trial list) built in. One file per
/// layout (builder/layouts/<name>.cpp) and one line in all_layouts() (builder/layouts/layout_list.cpp).
#include <filesystem>
#include <string>
#include <vector>

#include "../scan.h"

namespace melforge::builder::layouts {

/// What a layout's scan is given.
struct LayoutContext {
  /// The dataset's root folder as distributed (`--input`).
  std::filesystem::path root;
  /// File extensions taken as audio, lower case, without dots (--extensions).
  std::vector<std::string> extensions;
  /// Scan entries whose name starts with '.' (--include-hidden).
  bool include_hidden = false;
  /// Folders left out of the scan (the build's output folder), as ScanOptions::exclude.
  std::vector<std::filesystem::path> exclude;
};

/// One dataset layout.
struct Layout {
  /// The --layout value, lower case (`esc50`).
  std::string name;
  /// One line for --help and errors: the dataset and its protocol.
  std::string summary;
  /// Scans `context.root`; throws FormatError naming the missing or malformed metadata file and field.
  ScanResult (*scan)(const LayoutContext& context);
};

/// Every layout, in the order --help lists them.
const std::vector<Layout>& all_layouts();

/// The layout called `name` (any letter case). Throws InvalidArgument naming --layout and listing the names.
const Layout& find_layout(const std::string& name);

}  // namespace melforge::builder::layouts
