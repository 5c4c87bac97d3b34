#include "tests/eval/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvcache/kernels/convert.h"
#include "tests/eval/mini_json.h"

namespace kvcache::eval {
namespace {

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Reads one header entry `name` -> {"dtype", "shape", "data_offsets"}.
absl::Status ParseEntry(const std::string& name, const JsonValue& v, uint64_t data_bytes,
                        TensorEntry* out) {
  if (v.kind != JsonValue::Kind::kObject) {
    return Invalid(absl::StrCat("tensor '", name, "' is a JSON ", JsonKindName(v.kind),
                                "; expected an object"));
  }
  out->name = name;
  const JsonValue* dtype = v.Find("dtype");
  if (dtype == nullptr || dtype->kind != JsonValue::Kind::kString) {
    return Invalid(absl::StrCat("tensor '", name, "': \"dtype\" missing or not a string"));
  }
  out->dtype = dtype->string;
  const uint64_t elt = SafetensorsDTypeSize(out->dtype);
  if (elt == 0) {
    return Invalid(absl::StrCat("tensor '", name, "': unknown dtype \"", out->dtype, "\""));
  }
  const JsonValue* shape = v.Find("shape");
  if (shape == nullptr || shape->kind != JsonValue::Kind::kArray) {
    return Invalid(absl::StrCat("tensor '", name, "': \"shape\" missing or not an array"));
  }
  uint64_t numel = 1;
  for (size_t i = 0; i < shape->array.size(); ++i) {
    const JsonValue& d = shape->array[i];
    if (d.kind != JsonValue::Kind::kNumber || !d.is_uint) {
      return Invalid(
          absl::StrCat("tensor '", name, "': shape[", i, "] is not a non-negative integer"));
    }
    out->shape.push_back(d.uint_value);
    if (d.uint_value != 0 && numel > UINT64_MAX / d.uint_value) {
      return Invalid(absl::StrCat("tensor '", name, "': shape ", ShapeString(out->shape),
                                  "... overflows 64 bits"));
    }
    numel *= d.uint_value;
  }
  if (numel > UINT64_MAX / elt) {
    return Invalid(absl::StrCat("tensor '", name, "': byte size overflows 64 bits"));
  }
  const JsonValue* offsets = v.Find("data_offsets");
  if (offsets == nullptr || offsets->kind != JsonValue::Kind::kArray ||
      offsets->array.size() != 2 || !offsets->array[0].is_uint || !offsets->array[1].is_uint) {
    return Invalid(absl::StrCat("tensor '", name,
                                "': \"data_offsets\" must be [begin, end] non-negative integers"));
  }
  out->begin = offsets->array[0].uint_value;
  out->end = offsets->array[1].uint_value;
  if (out->begin > out->end || out->end > data_bytes) {
    return Invalid(absl::StrCat("tensor '", name, "': data_offsets [", out->begin, ", ", out->end,
                                ") out of range of the ", data_bytes, "-byte data buffer"));
  }
  if (out->end - out->begin != numel * elt) {
    return Invalid(absl::StrCat("tensor '", name, "': shape ", ShapeString(out->shape), " of ",
                                out->dtype, " is ", numel * elt, " bytes but data_offsets span ",
                                out->end - out->begin));
  }
  return absl::OkStatus();
}

kernels::DType KernelDType(std::string_view dtype) {
  if (dtype == "F16") return kernels::DType::kFloat16;
  if (dtype == "BF16") return kernels::DType::kBFloat16;
  return kernels::DType::kFloat32;
}

// Converts a validated F16/BF16/F32 tensor to fp32.
absl::Status ToFloat(const SafetensorsFile& file, const TensorEntry& t, std::vector<float>* out) {
  const std::string_view raw = file.Data(t);
  const kernels::DType dtype = KernelDType(t.dtype);
  const size_t elt = kernels::DTypeSize(dtype);
  const size_t count = raw.size() / elt;
  out->resize(count);
  if (dtype == kernels::DType::kFloat32) {
    std::memcpy(out->data(), raw.data(), raw.size());
    return absl::OkStatus();
  }
  std::vector<uint16_t> bits(count);  // aligned copy: offsets in the file may be odd
  std::memcpy(bits.data(), raw.data(), raw.size());
  if (kernels::ConvertCpu(bits.data(), dtype, static_cast<int64_t>(count), kernels::DType::kFloat32,
                          out->data()) != kernels::KernelStatus::kOk) {
    return Invalid(absl::StrCat("tensor '", t.name, "': conversion failed"));
  }
  return absl::OkStatus();
}

// Checks a q/k/v tensor: float dtype and shape [heads, tokens, head_dim].
absl::Status CheckKvTensor(const TensorEntry* t, const std::string& name) {
  if (t == nullptr) return Invalid(absl::StrCat("missing tensor '", name, "'"));
  if (t->dtype != "F16" && t->dtype != "BF16" && t->dtype != "F32") {
    return Invalid(
        absl::StrCat("tensor '", name, "' has dtype ", t->dtype, "; expected F16, BF16 or F32"));
  }
  if (t->shape.size() != 3 || t->shape[0] == 0 || t->shape[1] == 0 || t->shape[2] == 0) {
    return Invalid(absl::StrCat("tensor '", name, "' has shape ", ShapeString(t->shape),
                                "; expected [heads, tokens, head_dim], all > 0"));
  }
  if (t->shape[0] > (1u << 16) || t->shape[1] > (1u << 24) || t->shape[2] > (1u << 14)) {
    return Invalid(absl::StrCat("tensor '", name, "' has shape ", ShapeString(t->shape),
                                "; beyond kvcache-eval's limits (heads 65536, tokens 2^24, "
                                "head_dim 16384)"));
  }
  return absl::OkStatus();
}

void AppendTensorHeader(std::string* header, const std::string& name, const std::string& dtype,
                        const std::vector<uint64_t>& shape, uint64_t begin, uint64_t end) {
  absl::StrAppend(header, header->size() > 1 ? "," : "", "\"", name, "\":{\"dtype\":\"", dtype,
                  "\",\"shape\":", ShapeString(shape), ",\"data_offsets\":[", begin, ",", end,
                  "]}");
}

std::string JsonEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, " ");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

const TensorEntry* SafetensorsFile::Find(std::string_view name) const {
  for (const TensorEntry& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string_view SafetensorsFile::Data(const TensorEntry& t) const {
  return std::string_view(bytes).substr(data_start + t.begin, t.end - t.begin);
}

uint64_t SafetensorsDTypeSize(std::string_view dtype) {
  static const std::map<std::string_view, uint64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string bytes) {
  SafetensorsFile file;
  if (bytes.size() < 8) {
    return absl::DataLossError(absl::StrCat("safetensors: file is ", bytes.size(),
                                            " bytes; it must start with an 8-byte header length"));
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>(bytes[i]);
  }
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return Invalid(absl::StrCat("header length ", header_bytes, " exceeds the limit of ",
                                kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (header_bytes > bytes.size() - 8) {
    return absl::DataLossError(absl::StrCat("safetensors: header length ", header_bytes,
                                            " runs past the end of the ", bytes.size(),
                                            "-byte file (truncated?)"));
  }
  const std::string_view header = std::string_view(bytes).substr(8, header_bytes);
  if (header.empty() || header[0] != '{') return Invalid("header does not start with '{'");
  absl::StatusOr<JsonValue> json = ParseJson(header);
  if (!json.ok()) return Invalid(absl::StrCat("header: ", json.status().message()));
  if (json->kind != JsonValue::Kind::kObject) return Invalid("header is not a JSON object");
  file.data_start = 8 + header_bytes;
  const uint64_t data_bytes = bytes.size() - file.data_start;
  for (const auto& [name, value] : json->object) {
    if (name == "__metadata__") {
      if (value.kind != JsonValue::Kind::kObject) return Invalid("__metadata__ is not an object");
      for (const auto& [key, item] : value.object) {
        if (item.kind != JsonValue::Kind::kString) {
          return Invalid(absl::StrCat("__metadata__.", key, " is not a string"));
        }
        file.metadata.emplace_back(key, item.string);
      }
      continue;
    }
    TensorEntry entry;
    if (auto s = ParseEntry(name, value, data_bytes, &entry); !s.ok()) return s;
    file.tensors.push_back(std::move(entry));
  }
  std::vector<const TensorEntry*> by_offset;
  for (const TensorEntry& t : file.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorEntry* a = by_offset[i - 1];
    const TensorEntry* b = by_offset[i];
    if (b->begin < a->end) {
      return Invalid(absl::StrCat("tensors '", a->name, "' [", a->begin, ", ", a->end, ") and '",
                                  b->name, "' [", b->begin, ", ", b->end, ") overlap"));
    }
  }
  file.bytes = std::move(bytes);
  return file;
}

absl::StatusOr<KvDataset> DatasetFromSafetensors(const SafetensorsFile& file) {
  for (const auto& [key, value] : file.metadata) {
    if (key == "format" && value != "kvcache-eval/1") {
      return Invalid(absl::StrCat("__metadata__.format is \"", value,
                                  "\"; this reader understands \"kvcache-eval/1\""));
    }
    if (key == "rope" && value != "applied") {
      return Invalid(absl::StrCat("__metadata__.rope is \"", value,
                                  "\"; queries and keys must be stored after rotary embedding "
                                  "(\"applied\")"));
    }
  }
  int layers = 0;
  while (file.Find(absl::StrCat("layer", layers, ".q")) != nullptr ||
         file.Find(absl::StrCat("layer", layers, ".k")) != nullptr ||
         file.Find(absl::StrCat("layer", layers, ".v")) != nullptr) {
    ++layers;
  }
  if (layers == 0) return Invalid("missing tensor 'layer0.q' (no layers found)");
  KvDataset d;
  size_t used = 0;
  for (int l = 0; l < layers; ++l) {
    const std::string qn = absl::StrCat("layer", l, ".q");
    const std::string kn = absl::StrCat("layer", l, ".k");
    const std::string vn = absl::StrCat("layer", l, ".v");
    const TensorEntry* q = file.Find(qn);
    const TensorEntry* k = file.Find(kn);
    const TensorEntry* v = file.Find(vn);
    if (auto s = CheckKvTensor(q, qn); !s.ok()) return s;
    if (auto s = CheckKvTensor(k, kn); !s.ok()) return s;
    if (auto s = CheckKvTensor(v, vn); !s.ok()) return s;
    if (k->shape != v->shape) {
      return Invalid(absl::StrCat("'", kn, "' has shape ", ShapeString(k->shape), " but '", vn,
                                  "' has ", ShapeString(v->shape), "; they must match"));
    }
    if (q->shape[1] != k->shape[1] || q->shape[2] != k->shape[2]) {
      return Invalid(absl::StrCat("'", qn, "' has shape ", ShapeString(q->shape), " and '", kn,
                                  "' ", ShapeString(k->shape), "; tokens and head_dim must agree"));
    }
    if (q->shape[0] % k->shape[0] != 0) {
      return Invalid(absl::StrCat("'", qn, "' has ", q->shape[0], " heads, not a multiple of '", kn,
                                  "''s ", k->shape[0], " kv heads"));
    }
    const KvShape shape{.layers = layers,
                        .q_heads = static_cast<int>(q->shape[0]),
                        .kv_heads = static_cast<int>(k->shape[0]),
                        .head_dim = static_cast<int>(k->shape[2]),
                        .tokens = static_cast<int64_t>(k->shape[1])};
    if (l == 0) {
      d.shape = shape;
    } else if (shape.q_heads != d.shape.q_heads || shape.kv_heads != d.shape.kv_heads ||
               shape.head_dim != d.shape.head_dim || shape.tokens != d.shape.tokens) {
      return Invalid(absl::StrCat("layer ", l, " has q ", ShapeString(q->shape), " and k ",
                                  ShapeString(k->shape), "; layer 0 has q_heads ", d.shape.q_heads,
                                  ", kv_heads ", d.shape.kv_heads, ", tokens ", d.shape.tokens,
                                  ", head_dim ", d.shape.head_dim));
    }
    d.q.emplace_back();
    d.k.emplace_back();
    d.v.emplace_back();
    if (auto s = ToFloat(file, *q, &d.q.back()); !s.ok()) return s;
    if (auto s = ToFloat(file, *k, &d.k.back()); !s.ok()) return s;
    if (auto s = ToFloat(file, *v, &d.v.back()); !s.ok()) return s;
    used += 3;
  }
  const TensorEntry* pos = file.Find("positions");
  if (pos == nullptr) return Invalid("missing tensor 'positions'");
  if (pos->dtype != "I32" && pos->dtype != "I64") {
    return Invalid(
        absl::StrCat("tensor 'positions' has dtype ", pos->dtype, "; expected I32 or I64"));
  }
  if (pos->shape.size() != 1 || pos->shape[0] != static_cast<uint64_t>(d.shape.tokens)) {
    return Invalid(absl::StrCat("tensor 'positions' has shape ", ShapeString(pos->shape),
                                "; expected [", d.shape.tokens, "]"));
  }
  const std::string_view raw = file.Data(*pos);
  const size_t elt = pos->dtype == "I32" ? 4 : 8;
  for (int64_t t = 0; t < d.shape.tokens; ++t) {
    int64_t p = 0;
    if (elt == 4) {
      int32_t p32 = 0;
      std::memcpy(&p32, raw.data() + t * 4, 4);
      p = p32;
    } else {
      std::memcpy(&p, raw.data() + t * 8, 8);
    }
    if (p != t) {
      return Invalid(absl::StrCat("positions[", t, "] = ", p, ", expected ", t,
                                  " (a dump holds one whole sequence from position 0)"));
    }
  }
  ++used;
  d.description = absl::StrCat("KV dump: ", d.shape.layers, " layers, ", d.shape.q_heads,
                               " query heads, ", d.shape.kv_heads, " kv heads, head_dim ",
                               d.shape.head_dim, ", ", d.shape.tokens, " tokens");
  if (used < file.tensors.size()) {
    absl::StrAppend(&d.description, " (", file.tensors.size() - used, " other tensors ignored)");
  }
  if (auto s = d.Validate(); !s.ok()) return s;
  return d;
}

absl::StatusOr<KvDataset> LoadKvDump(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  absl::StatusOr<SafetensorsFile> file = ParseSafetensors(std::move(bytes));
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat(path, ": ", file.status().message()));
  }
  absl::StatusOr<KvDataset> d = DatasetFromSafetensors(*file);
  if (!d.ok()) {
    return absl::Status(d.status().code(), absl::StrCat(path, ": ", d.status().message()));
  }
  d->description = absl::StrCat(d->description, " from ", path);
  return d;
}

std::string FrameSafetensors(std::string_view header, std::string_view data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out.append(header);
  out.append(data);
  return out;
}

absl::StatusOr<std::string> EncodeKvDump(const KvDataset& data, kernels::DType dtype) {
  if (auto s = data.Validate(); !s.ok()) return s;
  std::string st_dtype;
  switch (dtype) {
    case kernels::DType::kFloat16:
      st_dtype = "F16";
      break;
    case kernels::DType::kBFloat16:
      st_dtype = "BF16";
      break;
    case kernels::DType::kFloat32:
      st_dtype = "F32";
      break;
    default:
      return absl::InvalidArgumentError("dump dtype must be f16, bf16 or f32");
  }
  const KvShape& s = data.shape;
  const size_t elt = kernels::DTypeSize(dtype);
  std::string header = "{";
  std::string body;
  auto add = [&](const std::string& name, const std::vector<float>& values, uint64_t heads) {
    const uint64_t begin = body.size();
    std::string bytes(values.size() * elt, '\0');
    kernels::ConvertCpu(values.data(), kernels::DType::kFloat32,
                        static_cast<int64_t>(values.size()), dtype, bytes.data());
    body += bytes;
    AppendTensorHeader(&header, name, st_dtype,
                       {heads, static_cast<uint64_t>(s.tokens), static_cast<uint64_t>(s.head_dim)},
                       begin, body.size());
  };
  for (int l = 0; l < s.layers; ++l) {
    add(absl::StrCat("layer", l, ".q"), data.q[l], s.q_heads);
    add(absl::StrCat("layer", l, ".k"), data.k[l], s.kv_heads);
    add(absl::StrCat("layer", l, ".v"), data.v[l], s.kv_heads);
  }
  const uint64_t pos_begin = body.size();
  for (int64_t t = 0; t < s.tokens; ++t) {
    char b[8];
    std::memcpy(b, &t, 8);
    body.append(b, 8);
  }
  AppendTensorHeader(&header, "positions", "I64", {static_cast<uint64_t>(s.tokens)}, pos_begin,
                     body.size());
  absl::StrAppend(&header,
                  ",\"__metadata__\":{\"format\":\"kvcache-eval/1\",\"rope\":\"applied\","
                  "\"description\":\"",
                  JsonEscape(data.description), "\"}}");
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  return FrameSafetensors(header, body);
}

absl::Status WriteKvDump(const std::string& path, const KvDataset& data, kernels::DType dtype) {
  absl::StatusOr<std::string> bytes = EncodeKvDump(data, dtype);
  if (!bytes.ok()) return bytes.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::NotFoundError(absl::StrCat("cannot create ", path));
  out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

}  // namespace kvcache::eval
