#include "png_writer.h"

#include <algorithm>
#include <array>

namespace kvcache::ctl {
namespace {

void PutU32(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}

void Chunk(std::string* out, const char type[4], const std::string& data) {
  PutU32(out, static_cast<uint32_t>(data.size()));
  std::string typed(type, 4);
  typed += data;
  out->append(typed);
  PutU32(out, Crc32(typed));
}

}  // namespace

RgbImage::RgbImage(uint32_t w, uint32_t h, uint32_t background) : width(w), height(h) {
  rgb.resize(size_t{w} * h * 3);
  Fill(0, 0, static_cast<int>(w), static_cast<int>(h), background);
}

void RgbImage::Fill(int x, int y, int w, int h, uint32_t colour) {
  const int x0 = std::max(x, 0);
  const int y0 = std::max(y, 0);
  const int x1 = std::min<int64_t>(int64_t{x} + w, width);
  const int y1 = std::min<int64_t>(int64_t{y} + h, height);
  for (int row = y0; row < y1; ++row) {
    for (int col = x0; col < x1; ++col) {
      uint8_t* p = &rgb[(size_t{static_cast<uint32_t>(row)} * width + col) * 3];
      p[0] = static_cast<uint8_t>(colour >> 16);
      p[1] = static_cast<uint8_t>(colour >> 8);
      p[2] = static_cast<uint8_t>(colour);
    }
  }
}

uint32_t Crc32(const std::string& bytes) {
  static const std::array<uint32_t, 256> kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) c = kTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

std::string EncodePng(const RgbImage& image) {
  // The filtered scanlines: a 0 (no filter) before each row.
  std::string raw;
  const size_t row_bytes = size_t{image.width} * 3;
  raw.reserve((row_bytes + 1) * image.height);
  for (uint32_t y = 0; y < image.height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(&image.rgb[y * row_bytes]), row_bytes);
  }
  // zlib: header (deflate, 32 KiB window, no dictionary), stored blocks of at
  // most 65535 bytes, Adler-32 of the uncompressed bytes.
  std::string z = {'\x78', '\x01'};
  for (size_t at = 0; at < raw.size() || raw.empty();) {
    const size_t n = std::min<size_t>(65535, raw.size() - at);
    const bool last = at + n == raw.size();
    z.push_back(last ? '\x01' : '\x00');
    z.push_back(static_cast<char>(n & 0xff));
    z.push_back(static_cast<char>(n >> 8));
    z.push_back(static_cast<char>(~n & 0xff));
    z.push_back(static_cast<char>((~n >> 8) & 0xff));
    z.append(raw, at, n);
    at += n;
    if (raw.empty()) break;
  }
  uint32_t a = 1;
  uint32_t b = 0;
  for (unsigned char c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  PutU32(&z, (b << 16) | a);

  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  PutU32(&ihdr, image.width);
  PutU32(&ihdr, image.height);
  ihdr += std::string{'\x08', '\x02', '\x00', '\x00', '\x00'};  // 8-bit RGB, no interlace
  Chunk(&png, "IHDR", ihdr);
  Chunk(&png, "IDAT", z);
  Chunk(&png, "IEND", "");
  return png;
}

}  // namespace kvcache::ctl
