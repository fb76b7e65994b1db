/// UrbanSound8K (Salamon et al. 2014): `metadata/UrbanSound8K.csv`
/// (slice_file_name,fsID,start,end,salience,fold,classID,class) and `audio/fold1..fold10/`; 10-fold
/// cross-validation by the fold column, classes in classID order, grouped by fsID (docs/LAYOUTS.md).
#include <map>
#include <string>

#include "layout_util.h"
#include "melforge/common/errors.h"

namespace fs = std::filesystem;

namespace melforge::builder::layouts {

namespace urbansound8k {

constexpr int kFolds = 10;
constexpr const char* kMeta = "metadata/UrbanSound8K.csv";

/// The fold folders under audio/ that hold a file called `name`, from the files found.
std::map<std::string, std::vector<std::string>> folders_by_name(const AudioFiles& found) {
  std::map<std::string, std::vector<std::string>> by_name;
  for (const auto& [rel, path] : found) {
    const fs::path p(rel);
    by_name[p.filename().string()].push_back(p.parent_path().generic_string());
  }
  return by_name;
}

ScanResult scan(const LayoutContext& context) {
  LayoutContext ctx = context;
  ctx.root = dataset_root(context, "urbansound8k");
  ScanResult out;
  DatasetWalk walk(ctx, out);
  const MetaTable t = read_table(ctx.root, kMeta,
                                 "UrbanSound8K's metadata (slice_file_name,fsID,start,end,salience,fold,classID,"
                                 "class); --input must be the UrbanSound8K root (the folder holding metadata/ and "
                                 "audio/)",
                                 true);
  const std::size_t c_file = column(t, "slice_file_name"), c_fsid = column(t, "fsid"), c_fold = column(t, "fold"),
                    c_id = column(t, "classid"), c_class = column(t, "class");
  const AudioFiles found = walk.audio_below(ctx.root / "audio", "UrbanSound8K's audio folder (audio/fold<k>/)");
  const auto by_name = folders_by_name(found);
  std::map<std::string, bool> listed;
  std::map<int, std::string> classes;
  std::size_t missing = 0;
  for (const auto& row : t.rows) {
    const std::string name = file_name_field(t, row, c_file);
    const int fold = int_field(t, row, c_fold, 1, kFolds);
    const std::string label = text_field(t, row, c_class);
    note_index(classes, int_field(t, row, c_id, 0, 1 << 20), label, t, row);
    const std::string group = text_field(t, row, c_fsid);
    const std::string rel = "audio/fold" + std::to_string(fold) + "/" + name;
    if (!listed.emplace(rel, true).second)
      throw FormatError(where(t.name, row.line) + "'" + rel + "' is listed twice");
    const auto it = found.find(rel);
    if (it != found.end()) {
      out.files.push_back({it->second, rel, label, -1, {}, fold, group});
      continue;
    }
    if (const auto other = by_name.find(name); other != by_name.end())
      throw FormatError(where(t.name, row.line) + "'" + name + "' has fold " + std::to_string(fold) +
                        ", but the file is in '" + other->second.front() + "/', not in 'audio/fold" +
                        std::to_string(fold) + "/': the metadata and the fold folders disagree (restore the dataset "
                        "as distributed; the folds are the protocol)");
    out.skipped.push_back({rel, std::string("listed in ") + kMeta + " line " + std::to_string(row.line) +
                                    " but not found on disk", "scan"});
    ++missing;
  }
  skip_unlisted(found, listed, std::string("not listed in ") + kMeta + " for this folder", out);
  warn_missing(out, missing, kMeta);
  warn_groups_across_folds(out, "fsID");
  out.class_order = order_by_index(classes);
  out.folds = kFolds;
  warn_empty_folds(out);
  out.group_by = "fsID (metadata/UrbanSound8K.csv: the Freesound recording a slice was cut from)";
  out.protocol_notes = {
      "UrbanSound8K: 10-fold cross-validation by the predefined folds (metadata/UrbanSound8K.csv's fold column, "
      "checked against audio/fold<k>/); mean accuracy over the 10 folds is the published metric",
      "classes in classID order, groups: fsID"};
  finish(out, "urbansound8k", ctx.root);
  return out;
}

}  // namespace urbansound8k

/// The UrbanSound8K layout (layout_list.cpp).
Layout urbansound8k_layout() {
  return {"urbansound8k",
          "UrbanSound8K: metadata/UrbanSound8K.csv + audio/fold1..10/, 10 folds, classes in classID order, groups fsID",
          &urbansound8k::scan};
}

}  // namespace melforge::builder::layouts
