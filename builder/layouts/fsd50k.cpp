/// FSD50K (Fonseca et al. 2021): `FSD50K.ground_truth/{dev.csv,eval.csv,vocabulary.csv}`, `FSD50K.dev_audio/`,
/// `FSD50K.eval_audio/`; multi-label, dev's split column as train/val, eval as test, classes in vocabulary order
/// (docs/LAYOUTS.md).
#include <map>
#include <set>
#include <string>

#include "layout_util.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace fs = std::filesystem;

namespace melforge::builder::layouts {

namespace fsd50k {

constexpr const char* kTruth = "FSD50K.ground_truth/";

/// vocabulary.csv (`index,label,mid`, no header): the classes in index order. Throws FormatError for an index
/// that is not 0..N-1 once each, or a label given twice.
std::vector<std::string> read_vocabulary(const fs::path& root) {
  const MetaTable t = read_table(root, std::string(kTruth) + "vocabulary.csv",
                                 "FSD50K's class vocabulary (index,label,mid, no header)", false, false, 2);
  std::map<int, std::string> by_index;
  for (const auto& row : t.rows) {
    const int index = int_field(t, row, 0, 0, static_cast<int>(t.rows.size()) - 1);
    note_index(by_index, index, text_field(t, row, 1), t, row);
  }
  if (by_index.size() != t.rows.size())
    throw FormatError(t.name + ": " + std::to_string(t.rows.size()) + " rows but " +
                      std::to_string(by_index.size()) + " distinct indices (each of 0.." +
                      std::to_string(t.rows.size() - 1) + " once)");
  return order_by_index(by_index);
}

/// The labels of a `labels` field (`"Electric_guitar,Guitar,Music"`), each in `vocabulary`, none twice.
std::vector<std::string> row_labels(const MetaTable& t, const MetaRow& row, std::size_t col,
                                    const std::set<std::string>& vocabulary) {
  const std::string field = text_field(t, row, col);
  std::vector<std::string> labels;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = field.find(',', start);
    const std::string label = trim(field.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (!vocabulary.contains(label))
      throw FormatError(where(t.name, row.line) + "label '" + utf8::for_terminal(label) +
                        "' is not in FSD50K.ground_truth/vocabulary.csv");
    for (const auto& l : labels)
      if (l == label) throw FormatError(where(t.name, row.line) + "label '" + utf8::for_terminal(label) + "' twice");
    labels.push_back(label);
    if (end == std::string::npos) return labels;
    start = end + 1;
  }
}

/// Adds the rows of one ground-truth file (`dev.csv` with its split column, or `eval.csv`: test) whose audio lies in
/// `audio_dir` (relative to the root); returns how many listed files were not found.
std::size_t add_rows(const fs::path& root, const std::string& csv, const std::string& audio_dir, DatasetWalk& walk,
                     const std::set<std::string>& vocabulary, std::map<std::string, bool>& fnames, ScanResult& out) {
  const bool dev = csv == "dev.csv";
  const MetaTable t = read_table(root, kTruth + csv,
                                 dev ? "FSD50K's dev ground truth (fname,labels,mids,split)"
                                     : "FSD50K's eval ground truth (fname,labels,mids)",
                                 true);
  const std::size_t c_fname = column(t, "fname"), c_labels = column(t, "labels");
  const std::size_t c_split = dev ? column(t, "split") : 0;
  const AudioFiles found = walk.audio_below(root / audio_dir, "FSD50K's audio folder " + audio_dir + "/");
  std::map<std::string, bool> listed;
  std::size_t missing = 0;
  for (const auto& row : t.rows) {
    const std::string fname = file_name_field(t, row, c_fname);
    std::vector<std::string> labels = row_labels(t, row, c_labels, vocabulary);
    int split = 2;
    if (dev) {
      const std::string s = lower(text_field(t, row, c_split));
      split = s == "train" ? 0 : s == "val" || s == "valid" || s == "validation" ? 1 : -1;
      if (split < 0)
        throw FormatError(where(t.name, row.line) + "split '" + utf8::for_terminal(s) + "', expected train or val");
    }
    if (!fnames.emplace(fname, true).second)
      throw FormatError(where(t.name, row.line) + "fname " + utf8::for_terminal(fname) +
                        " is listed twice (in dev.csv and eval.csv, or twice in one)");
    const std::string rel = audio_dir + "/" + fname + ".wav";
    listed.emplace(rel, true);
    const auto it = found.find(rel);
    if (it == found.end()) {
      out.skipped.push_back({rel, "listed in " + t.name + " line " + std::to_string(row.line) +
                                      " but not found on disk", "scan"});
      ++missing;
      continue;
    }
    InputFile f{it->second, rel, labels[0], split, {}, 0, ""};
    if (labels.size() > 1) f.labels = std::move(labels);
    out.files.push_back(std::move(f));
  }
  skip_unlisted(found, listed, "not listed in " + t.name, out);
  return missing;
}

ScanResult scan(const LayoutContext& context) {
  LayoutContext ctx = context;
  ctx.root = dataset_root(context, "fsd50k");
  ScanResult out;
  const std::vector<std::string> order = read_vocabulary(ctx.root);
  const std::set<std::string> vocabulary(order.begin(), order.end());
  DatasetWalk walk(ctx, out);
  std::map<std::string, bool> fnames;
  std::size_t missing = add_rows(ctx.root, "dev.csv", "FSD50K.dev_audio", walk, vocabulary, fnames, out);
  missing += add_rows(ctx.root, "eval.csv", "FSD50K.eval_audio", walk, vocabulary, fnames, out);
  warn_missing(out, missing, "FSD50K.ground_truth/dev.csv and eval.csv");
  std::size_t counts[3] = {0, 0, 0};
  for (const auto& f : out.files) ++counts[f.split];
  out.class_order = order;
  out.multilabel = true;
  out.presplit = true;
  out.protocol_notes = {
      "FSD50K: dev.csv's split column -> train (" + std::to_string(counts[0]) + " files) and val (" +
          std::to_string(counts[1]) + "), eval.csv -> test (" + std::to_string(counts[2]) +
          "); multi-label (--task multilabel), macro mAP on eval is the published metric",
      "classes in FSD50K.ground_truth/vocabulary.csv's index order (" + std::to_string(order.size()) +
          " classes); labels as given (already propagated up the ontology)"};
  finish(out, "fsd50k", ctx.root);
  return out;
}

}  // namespace fsd50k

/// The FSD50K layout (layout_list.cpp).
Layout fsd50k_layout() {
  return {"fsd50k",
          "FSD50K: FSD50K.ground_truth/ dev.csv (train/val), eval.csv (test), vocabulary.csv order; multi-label",
          &fsd50k::scan};
}

}  // namespace melforge::builder::layouts
