// EncodePng: an RGB image as a PNG file, for kvcachectl's raster output.
//
// The image data is zlib-wrapped with stored (uncompressed) deflate blocks, so
// no compression library is needed: files are about width x height x 3 bytes,
// which is small for heatmaps. Every PNG reader accepts it (PNG 1.2: colour
// type 2, bit depth 8, filter 0 on each row, CRC-32 per chunk, Adler-32 over
// the zlib stream).
#ifndef KVCACHE_CLIENT_TOOLS_PNG_WRITER_H_
#define KVCACHE_CLIENT_TOOLS_PNG_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::ctl {

struct RgbImage {
  uint32_t width = 0;
  uint32_t height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3 bytes, row by row

  RgbImage(uint32_t w, uint32_t h, uint32_t background = 0xffffff);
  // Fills the rectangle [x, x + w) x [y, y + h), clipped to the image.
  void Fill(int x, int y, int w, int h, uint32_t rgb_colour);
};

// The PNG file's bytes. REQUIRES: width and height > 0.
std::string EncodePng(const RgbImage& image);

// CRC-32 (ISO 3309, as PNG uses it) of `bytes`.
uint32_t Crc32(const std::string& bytes);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CLIENT_TOOLS_PNG_WRITER_H_
