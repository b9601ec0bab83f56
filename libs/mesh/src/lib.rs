//! The server and client builders every service uses: tonic over TCP/UDS, health, reflection, tower layers.
