#include "melforge/common/flags.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <numeric>

#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"

namespace po = boost::program_options;

namespace melforge {

namespace {

/// `s` with every '_' read as '-'.
std::string dashed(std::string s) {
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

/// `s` without leading and trailing spaces and tabs.
std::string trimmed(const std::string& s) {
  const std::size_t first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

/// "; did you mean <prefix><nearest>?" or "" when no registered flag is near `name`.
std::string suggestion(const std::string& name, const po::options_description& desc, const std::string& prefix) {
  const std::string near = nearest_flag(name, desc);
  return near.empty() ? std::string() : "; did you mean " + prefix + near + "?";
}

/// The shortest registered long name that `query` (dashed) is a proper prefix of (the first registered among equals),
/// or "": the flag a cut-short spelling (`--n-mel`, `--long-sec`) was meant to be.
std::string shortest_extension(const std::string& query, const po::options_description& desc) {
  std::string best;
  for (const auto& option : desc.options()) {
    const auto [names, count] = option->long_names();
    for (std::size_t i = 0; i < count; ++i) {
      const std::string candidate = dashed(names[i]);
      if (candidate.size() > query.size() && candidate.compare(0, query.size(), query) == 0 &&
          (best.empty() || names[i].size() < best.size()))
        best = names[i];
    }
  }
  return best;
}

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), std::size_t{0});
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({substitute, row[j] + 1, row[j - 1] + 1});
    }
  }
  return row[b.size()];
}

std::string nearest_flag(const std::string& name, const po::options_description& desc) {
  const std::string query = dashed(name);
  if (const std::string longer = shortest_extension(query, desc); !longer.empty()) return longer;
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(2, query.size() / 3) + 1;
  for (const auto& option : desc.options()) {
    const auto [names, count] = option->long_names();
    for (std::size_t i = 0; i < count; ++i) {
      if (names[i].empty()) continue;
      const std::size_t d = edit_distance(query, dashed(names[i]));
      if (d < best_distance) {
        best_distance = d;
        best = names[i];
      }
    }
  }
  return best;
}

std::string unknown_flag_message(const std::string& name, const po::options_description& desc) {
  return "unrecognised option '--" + name + "'" + suggestion(name, desc, "--");
}

std::string canonical_flag(const std::string& name, const po::options_description& desc) {
  if (const auto* d = desc.find_nothrow(name, false)) return d->long_name();
  if (const auto* d = desc.find_nothrow(dashed(name), false)) return d->long_name();
  return {};
}

std::vector<std::string> canonical_args(const std::vector<std::string>& args, const po::options_description& desc) {
  std::vector<std::string> out;
  out.reserve(args.size());
  bool options_ended = false;
  for (const std::string& arg : args) {
    if (options_ended || arg.size() <= 2 || arg.compare(0, 2, "--") != 0) {
      options_ended = options_ended || arg == "--";
      out.push_back(arg);
      continue;
    }
    const std::size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const std::string canonical = canonical_flag(name, desc);
    if (canonical.empty())
      throw po::error(unknown_flag_message(name, desc));
    out.push_back("--" + canonical + (eq == std::string::npos ? std::string() : arg.substr(eq)));
  }
  return out;
}

int strict_command_line_style() {
  return po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
}

po::parsed_options parse_flags(const std::vector<std::string>& args, const po::options_description& desc,
                               const po::positional_options_description* positional) {
  po::command_line_parser parser(canonical_args(args, desc));
  parser.options(desc).style(strict_command_line_style());
  if (positional != nullptr) parser.positional(*positional);
  return parser.run();
}

std::string canonical_config(const std::string& text, const po::options_description& desc,
                             const std::string& source) {
  std::string out;
  out.reserve(text.size());
  std::size_t start = 0;
  bool in_section = false;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    const std::string content = trimmed(line.substr(0, line.find('#')));
    const std::size_t eq = line.find('=');
    in_section = in_section || (!content.empty() && content.front() == '[');
    if (in_section || content.empty() || content.front() == '[' || eq == std::string::npos ||
        eq > line.find('#')) {
      out += line;
    } else {
      const std::string key = trimmed(line.substr(0, eq));
      const std::string canonical = canonical_flag(key, desc);
      if (canonical.empty())
        throw po::error("unrecognised option '" + key + "' in " + source + suggestion(key, desc, ""));
      out += canonical + line.substr(eq);
    }
    if (end < text.size()) out += '\n';
    start = end + 1;
  }
  return out;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

std::string read_config_text(const std::string& path) {
  std::string text;
  try {
    text = read_regular_file(path, "--config");
  } catch (const IoError& e) {
    throw InvalidArgument(e.what());
  }
  if (text.rfind("\xef\xbb\xbf", 0) == 0) text.erase(0, 3);
  return text;
}

}  // namespace melforge
