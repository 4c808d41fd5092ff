#include <gtest/gtest.h>

#include "core/config.h"
#include "core/errors.h"
#include "core/size_policy.h"

namespace torch_uvm {
namespace {

TEST(Config, ParsesEveryOption) {
  auto c = parse_config(
      "max_split_size_mb:256, roundup_power2_divisions:4,release_threshold_mb:64,"
      "small_segment_mb:4,large_segment_mb:32,cap_fraction:0.5,cap_mb:1024,"
      "allow_oversubscription:True,advise_segments:off,async_prefetch:no,"
      "prefetch_chunk_mb:64");
  EXPECT_EQ(c.max_split_size, 256u << 20);
  EXPECT_EQ(c.roundup_power2_divisions, 4u);
  EXPECT_EQ(c.release_threshold, 64u << 20);
  EXPECT_EQ(c.small_segment_size, 4u << 20);
  EXPECT_EQ(c.large_segment_size, 32u << 20);
  EXPECT_DOUBLE_EQ(c.cap_fraction, 0.5);
  EXPECT_EQ(c.cap_bytes, 1024ull << 20);
  EXPECT_TRUE(c.allow_oversubscription);
  EXPECT_FALSE(c.advise_segments);
  EXPECT_FALSE(c.async_prefetch);
  EXPECT_EQ(c.prefetch_chunk, 64u << 20);
}

TEST(Config, EmptyTextKeepsDefaults) {
  auto c = parse_config("  ");
  EXPECT_EQ(c.max_split_size, SIZE_MAX);
  EXPECT_DOUBLE_EQ(c.cap_fraction, 0.8);
}

void expect_error(const std::string& text, const std::string& fragment) {
  try {
    parse_config(text);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message for '" << text << "': " << e.what();
  }
}

TEST(Config, MalformedValuesNameTheProblem) {
  expect_error("bogus:1", "unknown option 'bogus'");
  expect_error("bogus:1", "Valid keys: max_split_size_mb");
  expect_error("max_split_size_mb", "expected 'key:value'");
  expect_error("max_split_size_mb:abc", "non-negative number");
  expect_error("max_split_size_mb:-4", "non-negative number");
  expect_error("max_split_size_mb:0", "at least 4 KiB");
  expect_error("max_split_size_mb:1e30", "too large");
  expect_error("roundup_power2_divisions:3", "power of two");
  expect_error("cap_fraction:1.5", "(0, 1]");
  expect_error("cap_fraction:nan", "non-negative number");
  expect_error("allow_oversubscription:maybe", "expected 1/0");
  expect_error("large_segment_mb:4", "at least 10");
  expect_error("async_prefetch:maybe", "option 'async_prefetch'");
  expect_error("prefetch_chunk_mb:-1", "option 'prefetch_chunk_mb'");
}

TEST(Config, BooleansAcceptTheUsualSpellings) {
  for (auto t : {"1", "true", "TRUE", "yes", "On"}) EXPECT_TRUE(parse_bool(t, "x"));
  for (auto f : {"0", "false", "No", "off"}) EXPECT_FALSE(parse_bool(f, "x"));
  EXPECT_THROW(parse_bool("2", "x"), InvalidArgument);
  EXPECT_THROW(parse_bool("", "x"), InvalidArgument);
}

TEST(Config, EveryOptionIsDescribed) {
  auto lines = describe_options();
  EXPECT_EQ(lines.size(), 14u);
  EXPECT_NE(lines[0].find("max_split_size_mb (default unlimited)"), std::string::npos);
}

TEST(Config, ResidencyLimitAndPrefetchOnAlloc) {
  AllocatorConfig c = parse_config("residency_limit_mb:512,prefetch_on_alloc:true");
  EXPECT_EQ(c.residency_limit, 512u << 20);
  EXPECT_TRUE(c.prefetch_on_alloc);
  EXPECT_EQ(AllocatorConfig{}.residency_limit, 0u);
  EXPECT_FALSE(AllocatorConfig{}.prefetch_on_alloc);
  EXPECT_TRUE(AllocatorConfig{}.driver_counters);
  EXPECT_FALSE(parse_config("driver_counters:false").driver_counters);
  EXPECT_THROW(parse_config("residency_limit_mb:0"), InvalidArgument);
  EXPECT_THROW(parse_config("prefetch_on_alloc:maybe"), InvalidArgument);
}

TEST(SizePolicy, RoundsTo512AndToPowerOfTwoDivisions) {
  SizePolicy plain{AllocatorConfig{}};
  EXPECT_EQ(plain.round_request(0), 512u);
  EXPECT_EQ(plain.round_request(1), 512u);
  EXPECT_EQ(plain.round_request(513), 1024u);
  EXPECT_EQ(plain.round_request(1200000), 1200128u);
  AllocatorConfig c;
  c.roundup_power2_divisions = 4;
  SizePolicy quarters{c};
  EXPECT_EQ(quarters.round_request(1200000), 1310720u);  // 1 MiB + 1/4 MiB
  EXPECT_EQ(quarters.round_request(1u << 20), 1u << 20);
  EXPECT_THROW(quarters.round_request(SIZE_MAX - 10), InvalidArgument);
}

TEST(SizePolicy, SegmentSizes) {
  SizePolicy p{AllocatorConfig{}};
  EXPECT_EQ(p.segment_size(512), 2u << 20);
  EXPECT_EQ(p.segment_size(1u << 20), 2u << 20);
  EXPECT_EQ(p.segment_size((1u << 20) + 512), 20u << 20);
  EXPECT_EQ(p.segment_size(10u << 20), 10u << 20);
  EXPECT_EQ(p.segment_size((10u << 20) + 512), 12u << 20);
  EXPECT_THROW(p.segment_size(SIZE_MAX - 511), InvalidArgument);
}

TEST(SizePolicy, SplitRules) {
  SizePolicy p{AllocatorConfig{}};
  EXPECT_TRUE(p.should_split(2u << 20, 512));          // small: any 512 B tail
  EXPECT_FALSE(p.should_split(1024, 1024));
  EXPECT_FALSE(p.should_split((2u << 20) + 512, 2u << 20));  // large: tail <= 1 MiB
  EXPECT_TRUE(p.should_split(20u << 20, 2u << 20));
}

TEST(Config, OffloadVariablesAreParsedOrNamedWhenBad) {
  OffloadEnvironment env;
  EXPECT_EQ(env.host_step_threads, 0);
  EXPECT_LT(env.host_step_copies, 0);
  parse_offload_variable("TORCH_UVM_HOST_STEP_THREADS", " 3 ", env);
  parse_offload_variable("TORCH_UVM_HOST_STEP_COPIES", "0.01", env);
  EXPECT_EQ(env.host_step_threads, 3);
  EXPECT_DOUBLE_EQ(env.host_step_copies, 0.01);
  parse_offload_variable("TORCH_UVM_HOST_STEP_COPIES", "", env);  // empty: unset, kept
  EXPECT_DOUBLE_EQ(env.host_step_copies, 0.01);
  for (const char* bad : {"0", "many", "-2", "3.0"}) {
    EXPECT_THROW(parse_offload_variable("TORCH_UVM_HOST_STEP_THREADS", bad, env),
                 InvalidArgument) << bad;
  }
  for (const char* bad : {"-0.5", "2", "nan", "an eighth"}) {
    EXPECT_THROW(parse_offload_variable("TORCH_UVM_HOST_STEP_COPIES", bad, env),
                 InvalidArgument) << bad;
  }
  EXPECT_EQ(env.host_step_threads, 3);  // refused values change nothing
  EXPECT_FALSE(env.quiet);
  parse_offload_variable("TORCH_UVM_QUIET", "yes", env);
  EXPECT_TRUE(env.quiet);
  EXPECT_THROW(parse_offload_variable("TORCH_UVM_QUIET", "quietly", env), InvalidArgument);
  EXPECT_TRUE(env.quiet);
  EXPECT_THROW(parse_offload_variable("TORCH_UVM_NOTHING", "1", env), InvalidArgument);
  EXPECT_EQ(describe_offload_variables().size(), 3u);
}

}  // namespace
}  // namespace torch_uvm
