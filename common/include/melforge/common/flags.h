#pragma once
/// The command-line conventions every binary shares (issue 16): a flag spelled the torchaudio way (`--n_fft` for
/// `--n-fft`, `--norm` for `--mel-norm`) is read as the registered flag, an unknown flag is refused with the nearest
/// registered one ("did you mean --n-fft?"), and the same holds for the keys of a --config INI file. Aliases are
/// registered with the flag itself, as extra long names of its Boost.Program_options description
/// (`("mel-norm,norm", ...)`); --help shows the first (canonical) name only.
#include <string>
#include <string_view>
#include <vector>

namespace boost::program_options {
class options_description;
class positional_options_description;
template <class charT>
class basic_parsed_options;
using parsed_options = basic_parsed_options<char>;
}  // namespace boost::program_options

namespace melforge {

/// Levenshtein distance between `a` and `b` (insertions, deletions and substitutions each cost 1).
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The registered long name (any of a flag's names, canonical or alias) `name` is most likely a misspelling of: the
/// shortest one that `name` is a proper prefix of (`n-mel` -> `n-mels`, `long-sec` -> `long-seconds`), else the
/// nearest by edit distance, or "" when none is within max(2, size/3) edits. Dashes and underscores count as the same
/// character.
std::string nearest_flag(const std::string& name, const boost::program_options::options_description& desc);

/// "unrecognised option '--name'", followed by "; did you mean --nearest?" when a registered flag is near `name`.
std::string unknown_flag_message(const std::string& name, const boost::program_options::options_description& desc);

/// The canonical name of the flag `name` (without dashes) as `desc` reads it: an exact name or alias, then the same
/// with every '_' read as '-'. A prefix of a flag is not a flag (issue 29: `--n-mel` is never `--n-mels`). Returns
/// "" for an unknown name.
std::string canonical_flag(const std::string& name, const boost::program_options::options_description& desc);

/// `args` (the command line without the program name) with every `--name` and `--name=value` rewritten to the
/// canonical flag of `desc`; short options, values, positional arguments and everything after a bare `--` are kept.
/// Throws boost::program_options::error "unrecognised option '--x'; did you mean --y?" for an unknown flag,
/// including a prefix of a registered one.
std::vector<std::string> canonical_args(const std::vector<std::string>& args,
                                        const boost::program_options::options_description& desc);

/// Boost's default command-line style without `allow_guessing`: no option is ever taken for a longer one it is a
/// prefix of. Every command_line_parser of melforge uses it (through parse_flags).
int strict_command_line_style();

/// `args` (the command line without the program name) parsed against `desc` (and `positional`, when given) as
/// every melforge binary and sub-command parses its flags: canonical_args, then Boost with
/// strict_command_line_style. Throws boost::program_options::error for an unknown flag (with "did you mean") or a
/// bad value.
boost::program_options::parsed_options parse_flags(
    const std::vector<std::string>& args, const boost::program_options::options_description& desc,
    const boost::program_options::positional_options_description* positional = nullptr);

/// The text of an INI options file (`n_fft = 512`) with every key rewritten to its canonical flag name (exact names
/// and aliases only, as Boost reads config files). Comments, blank lines and `[section]` lines are kept. Throws
/// boost::program_options::error naming `source`, the key and the nearest flag for an unknown key.
std::string canonical_config(const std::string& text, const boost::program_options::options_description& desc,
                             const std::string& source);

/// The text of the --config file `path`, without the UTF-8 byte order mark some editors write at its start. The file
/// is read with read_regular_file (melforge/common/fs_util.h): a FIFO, a device or a folder is refused before
/// reading (InvalidArgument), a file over 1 GiB too (FormatError), and one that cannot be opened or read
/// (InvalidArgument: exit 2).
std::string read_config_text(const std::string& path);

/// `s` in ASCII lower case: the spelling enum values are compared in (`Slaney`, `HTK`, `Hann` are accepted).
std::string ascii_lower(std::string_view s);

}  // namespace melforge
