#include "mergepipe/io/safetensors.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/file.hpp"
#include "strict_json.hpp"

namespace mergepipe::io {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw InputError(path + ": invalid safetensors file: " + problem);
}

std::string tensor_label(const std::string& name) {
  return "tensor '" + detail::printable(name) + "'";
}

std::uint64_t load_u64_le(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}

void store_u64_le(std::uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

void check_min_file_size(std::uint64_t file_size, const std::string& path) {
  if (file_size < 8) {
    fail(path, "file is " + std::to_string(file_size) +
                   " bytes, shorter than the 8-byte header length field");
  }
}

// The header length N from the first 8 bytes, checked against the limit and the file size.
std::uint64_t checked_header_length(const std::byte* first8, std::uint64_t file_size,
                                    const std::string& path) {
  const std::uint64_t n = load_u64_le(first8);
  if (n > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes (corrupt or not a safetensors file)");
  }
  if (n > file_size - 8) {
    fail(path, "header length " + std::to_string(n) + " needs " + std::to_string(8 + n) +
                   " bytes but the file has only " + std::to_string(file_size) + " (truncated?)");
  }
  return n;
}

// Offset of the first byte that breaks UTF-8 (overlongs, surrogates and > U+10FFFF included),
// or nullopt when the text is valid.
std::optional<std::size_t> find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c == 0xe0) {
      len = 3, lo = 0xa0;
    } else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) {
      len = 3;
    } else if (c == 0xed) {
      len = 3, hi = 0x9f;  // no UTF-16 surrogates
    } else if (c == 0xf0) {
      len = 4, lo = 0x90;
    } else if (c >= 0xf1 && c <= 0xf3) {
      len = 4;
    } else if (c == 0xf4) {
      len = 4, hi = 0x8f;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return i;
    i += len;
  }
  return std::nullopt;
}

// A JSON number that is a non-negative integer (no fraction, no exponent, fits in 64 bits).
std::optional<std::uint64_t> as_count(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return v.get<std::uint64_t>();
  return std::nullopt;
}

struct Entry {
  TensorInfo info;
  std::uint64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& path, const std::string& name, const json& value) {
  const std::string label = tensor_label(name);
  if (!value.is_object()) fail(path, label + ": entry is not a JSON object");
  Entry e;
  e.info.name = name;

  const auto dtype_it = value.find("dtype");
  if (dtype_it == value.end()) fail(path, label + ": missing \"dtype\"");
  if (!dtype_it->is_string())
    fail(path, label + ": dtype is not a string: " + detail::brief_dump(*dtype_it));
  const auto dtype = parse_dtype(dtype_it->get_ref<const std::string&>());
  if (!dtype) fail(path, label + ": unknown dtype " + detail::brief_dump(*dtype_it));
  e.info.dtype = *dtype;

  const auto shape_it = value.find("shape");
  if (shape_it == value.end()) fail(path, label + ": missing \"shape\"");
  if (!shape_it->is_array())
    fail(path, label + ": shape is not an array: " + detail::brief_dump(*shape_it));
  e.info.shape.reserve(shape_it->size());
  for (const json& d : *shape_it) {
    const auto dim = as_count(d);
    if (!dim)
      fail(path,
           label + ": shape entries must be non-negative integers, found " + detail::brief_dump(d));
    e.info.shape.push_back(*dim);
  }

  const auto off_it = value.find("data_offsets");
  if (off_it == value.end()) fail(path, label + ": missing \"data_offsets\"");
  if (!off_it->is_array() || off_it->size() != 2) {
    fail(path, label + ": data_offsets must be an array of two integers [begin, end], found " +
                   detail::brief_dump(*off_it));
  }
  const auto begin = as_count((*off_it)[0]);
  const auto end = as_count((*off_it)[1]);
  if (!begin || !end) {
    fail(path, label + ": data_offsets must be non-negative integers, found " +
                   detail::brief_dump(*off_it));
  }
  e.begin = *begin;
  e.end = *end;
  // Other keys are ignored, as the reference reader does.
  return e;
}

// Element count and byte size without overflow (the reference reader's ValidationOverflow).
std::uint64_t checked_nbytes(const std::string& path, const TensorInfo& info) {
  std::uint64_t n = 1;
  for (std::uint64_t d : info.shape) {
    if (d != 0 && n > UINT64_MAX / d) {
      fail(path, tensor_label(info.name) + ": element count of shape " + format_shape(info.shape) +
                     " overflows 64 bits");
    }
    n *= d;
  }
  const std::uint64_t size = dtype_size(info.dtype);
  if (n > UINT64_MAX / size) {
    fail(path, tensor_label(info.name) + ": byte size of shape " + format_shape(info.shape) +
                   " x " + std::string(dtype_name(info.dtype)) + " overflows 64 bits");
  }
  return n * size;
}

// The reference writer's dtype order (its Dtype enum, "increasing alignment order"); files are
// written in descending rank. Within one element size this fixes e.g. BF16 before F16.
int reference_dtype_rank(DType d) {
  switch (d) {
    case DType::kBool:
      return 0;
    case DType::kU8:
      return 1;
    case DType::kI8:
      return 2;
    case DType::kF8E5M2:
      return 3;
    case DType::kF8E4M3:
      return 4;
    case DType::kI16:
      return 5;
    case DType::kU16:
      return 6;
    case DType::kF16:
      return 7;
    case DType::kBF16:
      return 8;
    case DType::kI32:
      return 9;
    case DType::kU32:
      return 10;
    case DType::kF32:
      return 11;
    case DType::kF64:
      return 12;
    case DType::kI64:
      return 13;
    case DType::kU64:
      return 14;
  }
  return 0;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> header,
                                           std::uint64_t file_size, const std::string& path) {
  check_min_file_size(file_size, path);
  if (header.size() < 8) fail(path, "header buffer is shorter than 8 bytes");
  const std::uint64_t n = checked_header_length(header.data(), file_size, path);
  if (header.size() < 8 + n) {
    fail(path, "header buffer holds " + std::to_string(header.size()) + " bytes, fewer than the " +
                   std::to_string(8 + n) + " the header length needs");
  }

  SafetensorsHeader out;
  out.path = path;
  out.header_length = n;
  out.data_begin = 8 + n;
  out.file_size = file_size;
  out.header_hash = hash128_hex(header.data(), 8 + n);

  const std::string_view text(reinterpret_cast<const char*>(header.data() + 8), n);
  if (const auto bad = find_invalid_utf8(text)) {
    fail(path,
         "header is not valid UTF-8 (bad byte at header offset " + std::to_string(*bad) + ")");
  }
  const json doc =
      detail::parse_strict_json(text, path + ": invalid safetensors file: header", "tensor name");
  if (!doc.is_object()) fail(path, "header is not a JSON object");

  std::vector<Entry> entries;
  entries.reserve(doc.size());
  for (const auto& [key, value] : doc.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        fail(path,
             "\"__metadata__\" must be an object of string values (a tensor may not be named "
             "__metadata__), found " +
                 std::string(value.type_name()));
      }
      const bool tensor_like = value.contains("dtype") || value.contains("data_offsets");
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          fail(path, "__metadata__ value of '" + mkey +
                         "' is not a string: " + detail::brief_dump(mvalue) +
                         (tensor_like ? " (a tensor may not be named __metadata__)" : ""));
        }
        out.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    entries.push_back(parse_entry(path, key, value));
  }

  // The data section must be tiled exactly: sorted by offsets, each tensor starts where the
  // previous one ended, the first at 0 and the last at the end of the file.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.info.name) < std::tie(b.begin, b.end, b.info.name);
  });
  const std::uint64_t data_size = file_size - out.data_begin;
  std::uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    const std::string label = tensor_label(e.info.name);
    const std::string offsets = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.end < e.begin) fail(path, label + ": data_offsets " + offsets + " end before they begin");
    if (e.begin != covered) {
      if (!previous) {
        fail(path, label + " is first in the data section but starts at byte " +
                       std::to_string(e.begin) + ", not 0");
      }
      if (e.begin > covered) {
        fail(path, "gap in the data section: bytes [" + std::to_string(covered) + ", " +
                       std::to_string(e.begin) + ") between " + tensor_label(previous->info.name) +
                       " and " + label + " belong to no tensor");
      }
      fail(path, label + ": data_offsets " + offsets + " overlap " +
                     tensor_label(previous->info.name) + ", which ends at " +
                     std::to_string(covered));
    }
    const std::uint64_t need = checked_nbytes(path, e.info);
    if (e.end - e.begin != need) {
      fail(path, label + ": data_offsets " + offsets + " span " + std::to_string(e.end - e.begin) +
                     " bytes but " + std::string(dtype_name(e.info.dtype)) + " " +
                     format_shape(e.info.shape) + " needs " + std::to_string(need));
    }
    if (e.end > data_size) {
      fail(path, label + ": data_offsets " + offsets + " reach past the end of the data section (" +
                     std::to_string(data_size) + " bytes after the header; truncated?)");
    }
    covered = e.end;
    previous = &e;
  }
  if (covered < data_size) {
    fail(path, std::to_string(data_size - covered) +
                   " trailing bytes after the last tensor (the data section holds " +
                   std::to_string(data_size) + " bytes, the tensors cover " +
                   std::to_string(covered) + ")");
  }

  out.tensors.reserve(entries.size());
  for (Entry& e : entries) {
    StoredTensor t;
    t.info = std::move(e.info);
    t.file = path;
    t.offset = out.data_begin + e.begin;
    t.length = e.end - e.begin;
    out.tensors.push_back(std::move(t));
  }
  return out;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  File f(path, File::Mode::kRead);
  struct stat st {};
  if (::fstat(f.fd(), &st) != 0) throw IoError(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError(path + ": not a regular file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  check_min_file_size(file_size, path);

  std::vector<std::byte> bytes(8);
  f.read_at(0, bytes);
  const std::uint64_t n = checked_header_length(bytes.data(), file_size, path);
  bytes.resize(8 + n);
  f.read_at(8, std::span(bytes).subspan(8));
  global_byte_counters().add(ByteCategory::kOther, 8 + n);
  return parse_safetensors_header(bytes, file_size, path);
}

SafetensorsLayout layout_safetensors(const std::vector<TensorInfo>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  std::vector<std::size_t> order(tensors.size());
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    order[i] = i;
    const std::string& name = tensors[i].name;
    if (name == "__metadata__") {
      throw UsageError("safetensors writer: a tensor may not be named '__metadata__'");
    }
    if (!names.insert(name).second) {
      throw UsageError("safetensors writer: duplicate tensor name '" + name + "'");
    }
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const int ra = reference_dtype_rank(tensors[a].dtype);
    const int rb = reference_dtype_rank(tensors[b].dtype);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;  // std::string compares bytes as unsigned
  });

  std::map<std::string, std::string> meta = metadata;
  const auto format = meta.find("format");
  if (format != meta.end() && format->second != "pt") {
    throw UsageError("safetensors writer: metadata \"format\" must be \"pt\", got \"" +
                     format->second + "\"");
  }
  meta["format"] = "pt";

  // Compact JSON in a fixed key order; std::map keeps the metadata keys sorted.
  nlohmann::ordered_json header;
  nlohmann::ordered_json& meta_json = header["__metadata__"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : meta) meta_json[k] = v;
  SafetensorsLayout layout;
  layout.tensors.reserve(tensors.size());
  std::uint64_t offset = 0;
  for (std::size_t i : order) {
    const TensorInfo& info = tensors[i];
    const std::uint64_t nbytes = info.nbytes();
    if (offset > UINT64_MAX - nbytes) {
      throw UsageError("safetensors writer: total data size overflows at tensor '" + info.name +
                       "'");
    }
    nlohmann::ordered_json entry;
    entry["dtype"] = std::string(dtype_name(info.dtype));
    entry["shape"] = info.shape;
    entry["data_offsets"] = {offset, offset + nbytes};
    header[info.name] = std::move(entry);
    StoredTensor t;
    t.info = info;
    t.offset = offset;  // relative for now; made absolute once N is known
    t.length = nbytes;
    layout.tensors.push_back(std::move(t));
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw UsageError("safetensors writer: cannot encode the header: " + detail::json_error_text(e));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::uint64_t n = text.size();
  layout.header_bytes.resize(8);
  store_u64_le(n, layout.header_bytes.data());
  layout.header_bytes += text;
  for (StoredTensor& t : layout.tensors) t.offset += 8 + n;
  layout.file_size = 8 + n + offset;
  return layout;
}

void write_safetensors(const std::string& path, const std::vector<TensorInfo>& tensors,
                       const std::vector<std::span<const std::byte>>& data,
                       const std::map<std::string, std::string>& metadata) {
  if (data.size() != tensors.size()) {
    throw UsageError(path + ": write_safetensors got " + std::to_string(tensors.size()) +
                     " tensors but " + std::to_string(data.size()) + " data buffers");
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (data[i].size() != tensors[i].nbytes()) {
      throw UsageError(
          path + ": tensor '" + tensors[i].name + "' has " + std::to_string(data[i].size()) +
          " bytes of data but " + std::string(dtype_name(tensors[i].dtype)) + " " +
          format_shape(tensors[i].shape) + " needs " + std::to_string(tensors[i].nbytes()));
    }
  }
  SafetensorsLayout layout = layout_safetensors(tensors, metadata);
  std::unordered_map<std::string_view, std::size_t> index_of;
  for (std::size_t i = 0; i < tensors.size(); ++i) index_of.emplace(tensors[i].name, i);

  const std::string temp = temp_sibling_path(path);
  try {
    File f(temp, File::Mode::kCreateWrite);
    f.write_at(0, std::as_bytes(std::span(layout.header_bytes)));
    for (const StoredTensor& t : layout.tensors) {
      if (t.length > 0) f.write_at(t.offset, data[index_of.at(t.info.name)]);
    }
    f.sync();
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw IoError(path + ": cannot rename " + temp + " into place: " + std::strerror(err));
  }
  const std::string parent = std::filesystem::path(path).parent_path().string();
  sync_directory(parent.empty() ? "." : parent);
  global_byte_counters().add(ByteCategory::kOutputWritten, layout.file_size);
}

}  // namespace mergepipe::io
