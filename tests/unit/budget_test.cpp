// Budget forms: units, whitespace, percentages (exact), and the errors.
#include "mergepipe/budget.hpp"

#include <gtest/gtest.h>

#include "mergepipe/error.hpp"

using namespace mergepipe;

TEST(Budget, AbsoluteForms) {
  EXPECT_EQ(Budget::parse("4096").bytes, 4096u);
  EXPECT_EQ(Budget::parse("4096").kind, Budget::Kind::kBytes);
  EXPECT_EQ(Budget::parse("0").bytes, 0u);
  EXPECT_EQ(Budget::parse("17B").bytes, 17u);
  EXPECT_EQ(Budget::parse("1KB").bytes, 1000u);
  EXPECT_EQ(Budget::parse("900MB").bytes, 900000000u);
  EXPECT_EQ(Budget::parse("2GB").bytes, 2000000000u);
  EXPECT_EQ(Budget::parse("3TB").bytes, 3000000000000u);
  EXPECT_EQ(Budget::parse("1KiB").bytes, 1024u);
  EXPECT_EQ(Budget::parse("5MiB").bytes, 5u << 20);
  EXPECT_EQ(Budget::parse("12GiB").bytes, 12ull << 30);
  EXPECT_EQ(Budget::parse("2TiB").bytes, 2ull << 40);
  EXPECT_EQ(Budget::parse("12gib").bytes, 12ull << 30);  // case-insensitive
  EXPECT_EQ(Budget::parse("12 GiB").bytes, 12ull << 30);
  EXPECT_EQ(Budget::parse("  900MB\t").bytes, 900000000u);
  EXPECT_EQ(Budget::parse("1.5GiB").bytes, 3ull << 29);
  EXPECT_EQ(Budget::parse(".5KB").bytes, 500u);
  EXPECT_EQ(Budget::parse("2.0009KB").bytes, 2000u);  // floor of 2000.9 bytes
  EXPECT_EQ(Budget::parse("18446744073709551615").bytes, UINT64_MAX);
}

TEST(Budget, Fractions) {
  const Budget quarter = Budget::parse("25%");
  EXPECT_EQ(quarter.kind, Budget::Kind::kFraction);
  EXPECT_DOUBLE_EQ(quarter.fraction, 0.25);
  EXPECT_EQ(quarter.resolve(1000), 250u);
  EXPECT_EQ(quarter.resolve(1001), 250u);  // floor
  EXPECT_EQ(Budget::parse("100%").resolve(123456789), 123456789u);
  EXPECT_EQ(Budget::parse("0%").resolve(123456789), 0u);
  EXPECT_EQ(Budget::parse("12.5%").resolve(1000), 125u);
  EXPECT_EQ(Budget::parse(" 12.5 % ").resolve(1000), 125u);
  // Exact decimal arithmetic: 30% of 1000 is 300 (0.3 in binary would give 299).
  EXPECT_EQ(Budget::parse("30%").resolve(1000), 300u);
  EXPECT_EQ(Budget::parse("33.3%").resolve(1000), 333u);
  EXPECT_EQ(Budget::parse("150%").resolve(1000), 1500u);  // the type allows it; plans refuse it
  EXPECT_EQ(Budget::parse("100%").resolve(UINT64_MAX), UINT64_MAX);
  EXPECT_EQ(Budget::parse("200%").resolve(UINT64_MAX), UINT64_MAX);  // saturates
  EXPECT_EQ(Budget().resolve(77), 77u);                              // the default is 100%
  EXPECT_EQ(Budget::parse("12GiB").resolve(1), 12ull << 30);         // absolute ignores the total
}

TEST(Budget, ToStringParsesBack) {
  for (const char* text : {"25%", "12.5%", "0%", "100%", "150%", "0.001%", "4096", "0"}) {
    const Budget b = Budget::parse(text);
    EXPECT_EQ(b.to_string(), Budget::parse(b.to_string()).to_string()) << text;
    EXPECT_EQ(Budget::parse(b.to_string()).resolve(987654321), b.resolve(987654321)) << text;
  }
  EXPECT_EQ(Budget::parse("12.50%").to_string(), "12.5%");
  EXPECT_EQ(Budget::parse("1KiB").to_string(), "1024");
}

TEST(Budget, Errors) {
  auto message = [](const std::string& text) -> std::string {
    try {
      Budget::parse(text);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message("-1GB").find("negative"), std::string::npos);
  EXPECT_NE(message("-5%").find("negative"), std::string::npos);
  EXPECT_NE(message("abc").find("no number"), std::string::npos);
  EXPECT_NE(message("12XB").find("unknown unit 'XB'"), std::string::npos);
  EXPECT_NE(message("%").find("no number"), std::string::npos);
  EXPECT_NE(message("nan").find("not a finite"), std::string::npos);
  EXPECT_NE(message("inf").find("not a finite"), std::string::npos);
  EXPECT_NE(message("-Infinity").find("not a finite"), std::string::npos);
  EXPECT_NE(message("").find("empty"), std::string::npos);
  EXPECT_NE(message("   ").find("empty"), std::string::npos);
  EXPECT_NE(message("1e9").find("unknown unit"), std::string::npos);
  EXPECT_NE(message("12.5.3%").find("unknown unit"), std::string::npos);
  EXPECT_NE(message("123456789012345678901234567").find("too many digits"), std::string::npos);
  EXPECT_NE(message("1.00000000000000001%").find("too many digits"), std::string::npos);
  EXPECT_NE(message("18446744073709551616").find("too large"), std::string::npos);
  EXPECT_NE(message("18446744073709551616%").find("too large"), std::string::npos);
  EXPECT_NE(message("17000000TiB").find("too large"), std::string::npos);
  EXPECT_NE(message("abc").find("budget 'abc'"), std::string::npos);  // names the input
}

TEST(Budget, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(12ull << 30), "12.00 GiB");
}
