#pragma once
// ad — version of the library these headers belong to.
#define AD_VERSION_MAJOR 0
#define AD_VERSION_MINOR 1
#define AD_VERSION_PATCH 0
#define AD_VERSION_STRING "0.1.0"

namespace ad {
inline constexpr int kVersionMajor = AD_VERSION_MAJOR;
inline constexpr int kVersionMinor = AD_VERSION_MINOR;
inline constexpr int kVersionPatch = AD_VERSION_PATCH;
inline constexpr const char* kVersionString = AD_VERSION_STRING;
}  // namespace ad
