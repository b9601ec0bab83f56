//! Domain types: machines, states and transitions, resources, penalty buckets, requirements, profiles, needs, actions.
