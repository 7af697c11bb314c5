//! The attack suite (docs/SECURITY.md): every program in `attacks/` tries to
//! reach outside the code judge's sandbox (read the API key, the model,
//! /etc, another process's /proc; write or delete host files; open sockets;
//! spawn or fork; exhaust memory, disk, output or time; signal the server;
//! call libc through ctypes). Each is run through every path that executes
//! code: the judge itself, the trainer's code rewards, `tern bon --aggregate
//! reward --tests`, and `tern serve --allow-code-execution`. Every attack
//! must fail, nothing may change on the host, and the next request must be
//! answered normally. `memory` holds the request memory model's probes:
//! what a client could once make the server hold, now refused or bounded.
//! `limits` holds what a judged program could make the machine hold, and
//! `verdict` the forgeries of a verdict from inside the candidate's process.

mod bon;
mod fixture;
mod judge;
mod limits;
mod memory;
mod network;
mod server;
mod template;
mod verdict;
