//! The pod sandbox's process for a local node (what `registry.k8s.io/pause` is on a cluster with
//! a registry): holds the pod's namespaces and does nothing. As PID 1 of its namespace it gets
//! no signal but SIGKILL, which is how containerd stops a sandbox.

fn main() {
    loop {
        std::thread::park();
    }
}
