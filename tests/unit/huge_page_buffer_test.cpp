// The memory of O_DIRECT scratch and retained windows: whole 2 MiB pages, 2 MiB aligned, and
// advised for transparent huge pages (the segment count of a direct request depends on it).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "mergepipe/huge_page_buffer.hpp"

namespace mergepipe {
namespace {

bool aligned_to_huge_page(const std::byte* p) {
  return reinterpret_cast<std::uintptr_t>(p) % kHugePageBytes == 0;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The "THPeligible" line of the /proc/self/smaps mapping that holds `p`, or "" if none.
std::string thp_eligible_of(const std::byte* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &begin, &end) == 2) {
      inside = address >= begin && address < end;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return line;
  }
  return "";
}

TEST(HugePageBuffer, ReservesWholeAlignedHugePagesAndKeepsThem) {
  HugePageBuffer buffer;
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(buffer.capacity(), 0u);

  buffer.reserve(1);
  EXPECT_EQ(buffer.capacity(), kHugePageBytes);
  EXPECT_TRUE(aligned_to_huge_page(buffer.data()));
  buffer.data()[kHugePageBytes - 1] = std::byte{7};  // the whole capacity is usable

  const std::byte* first = buffer.data();
  buffer.reserve(kHugePageBytes);  // fits: same memory
  EXPECT_EQ(buffer.data(), first);
  EXPECT_EQ(buffer.data()[kHugePageBytes - 1], std::byte{7});

  buffer.reserve(kHugePageBytes + 1);
  EXPECT_EQ(buffer.capacity(), 2 * kHugePageBytes);
  EXPECT_TRUE(aligned_to_huge_page(buffer.data()));
  buffer.data()[2 * kHugePageBytes - 1] = std::byte{1};
}

TEST(HugePageBuffer, IsAdvisedForTransparentHugePages) {
  const std::string mode = file_text("/sys/kernel/mm/transparent_hugepage/enabled");
  if (mode.empty() || mode.find("[never]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off on this system";
  HugePageBuffer buffer;
  buffer.reserve(3 * kHugePageBytes);
  const std::string eligible = thp_eligible_of(buffer.data());
  if (eligible.empty()) GTEST_SKIP() << "this kernel's smaps has no THPeligible line";
  // In "madvise" mode a mapping is eligible only if it was advised.
  EXPECT_NE(eligible.find('1'), std::string::npos) << eligible << " (mode: " << mode << ")";
}

}  // namespace
}  // namespace mergepipe
