#![no_main]
use libfuzzer_sys::fuzz_target;
fuzz_target!(|data: &[u8]| kvpool_fuzz::rbg_control(data));
