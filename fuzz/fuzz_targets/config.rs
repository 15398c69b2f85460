#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| gpupool_fuzz::config(data));
