/// ESC-50 (Piczak 2015): `meta/esc50.csv` (filename,fold,target,category,esc10,src_file,take) and `audio/*.wav`;
/// 5-fold cross-validation by the fold column, classes in target order, grouped by src_file (docs/LAYOUTS.md).
#include <map>
#include <string>

#include "layout_util.h"
#include "melforge/common/errors.h"

namespace fs = std::filesystem;

namespace melforge::builder::layouts {

namespace esc50 {

constexpr int kFolds = 5;
constexpr const char* kMeta = "meta/esc50.csv";

ScanResult scan(const LayoutContext& context) {
  LayoutContext ctx = context;
  ctx.root = dataset_root(context, "esc50");
  ScanResult out;
  DatasetWalk walk(ctx, out);
  const MetaTable t = read_table(ctx.root, kMeta,
                                 "ESC-50's metadata (filename,fold,target,category,esc10,src_file,take); "
                                 "--input must be the ESC-50 root (the folder holding meta/ and audio/)",
                                 true);
  const std::size_t c_file = column(t, "filename"), c_fold = column(t, "fold"), c_target = column(t, "target"),
                    c_category = column(t, "category"), c_src = column(t, "src_file");
  const AudioFiles found = walk.audio_below(ctx.root / "audio", "ESC-50's audio folder (audio/<filename>)");
  std::map<std::string, bool> listed;
  std::map<int, std::string> classes;
  std::size_t missing = 0;
  for (const auto& row : t.rows) {
    const std::string rel = "audio/" + file_name_field(t, row, c_file);
    const int fold = int_field(t, row, c_fold, 1, kFolds);
    const std::string category = text_field(t, row, c_category);
    note_index(classes, int_field(t, row, c_target, 0, 1 << 20), category, t, row);
    const std::string src = text_field(t, row, c_src);
    if (!listed.emplace(rel, true).second)
      throw FormatError(where(t.name, row.line) + "'" + rel + "' is listed twice");
    const auto it = found.find(rel);
    if (it == found.end()) {
      out.skipped.push_back({rel, std::string("listed in ") + kMeta + " line " + std::to_string(row.line) +
                                      " but not found on disk", "scan"});
      ++missing;
      continue;
    }
    out.files.push_back({it->second, rel, category, -1, {}, fold, src});
  }
  skip_unlisted(found, listed, std::string("not listed in ") + kMeta, out);
  warn_missing(out, missing, kMeta);
  warn_groups_across_folds(out, "src_file");
  out.class_order = order_by_index(classes);
  out.folds = kFolds;
  warn_empty_folds(out);
  out.group_by = "src_file (meta/esc50.csv: the Freesound recording a clip was cut from)";
  out.protocol_notes = {
      "ESC-50: 5-fold cross-validation by meta/esc50.csv's fold column (melforge-train cv; mean accuracy over the "
      "5 folds is the published metric)",
      "classes in meta/esc50.csv's target order (0.." + std::to_string(classes.empty() ? 0 : classes.rbegin()->first) +
          "), groups: src_file"};
  finish(out, "esc50", ctx.root);
  return out;
}

}  // namespace esc50

/// The ESC-50 layout (layout_list.cpp).
Layout esc50_layout() {
  return {"esc50", "ESC-50: meta/esc50.csv + audio/, 5 folds (fold column), classes in target order, groups src_file",
          &esc50::scan};
}

}  // namespace melforge::builder::layouts
