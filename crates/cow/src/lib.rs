//! Android Virtual A/B COW format (v1/v2/v3): reader, writer, generator.
