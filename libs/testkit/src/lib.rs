//! Test helpers: throwaway CAs and role certificates, process and sandbox helpers.
