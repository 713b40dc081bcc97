//! Give the cdylib libblkio's SONAME so it is a drop-in `libblkio.so.1`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libblkio.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,relro");
}
