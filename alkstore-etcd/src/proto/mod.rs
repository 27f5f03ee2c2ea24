//! etcd's v3 gRPC API: the subset in `alkstore-etcd/proto/`, compiled to
//! Rust by `cargo xtask protos` and committed, so that a build needs no
//! `protoc` (docs/engine-etcd.md, "Generated code").

#![allow(clippy::all, clippy::pedantic, rust_2018_idioms)]

pub(crate) mod mvccpb {
    include!("mvccpb.rs");
}

pub(crate) mod etcdserverpb {
    include!("etcdserverpb.rs");
}
