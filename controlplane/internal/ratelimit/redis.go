package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisTimeout bounds each step of a limiter call to Redis: connecting, sending,
// reading the answer, and waiting for a pooled connection.
const RedisTimeout = 200 * time.Millisecond

// Redis shares counters across replicas.
type Redis struct {
	Client *redis.Client
	Prefix string
}

// RedisOptions parses REDIS_URL with the limiter's bounds: every request waits on this
// call, so it gets one attempt and short timeouts, and the request's deadline
// (Limiter.StoreTimeout) is honoured on the socket too.
//
// go-redis v9 reads MaxRetries 0 as "the default", which is three retries with backoff
// (a dead Redis then cost ~100 ms and a frozen one ~435 ms per request); -1 is none.
func RedisOptions(url string) (*redis.Options, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	opts.MaxRetries = -1
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout, opts.PoolTimeout = RedisTimeout, RedisTimeout, RedisTimeout, RedisTimeout
	opts.ContextTimeoutEnabled = true
	return opts, nil
}

// NewRedis is the Redis store for url, with RedisOptions.
func NewRedis(url, prefix string) (*Redis, error) {
	opts, err := RedisOptions(url)
	if err != nil {
		return nil, err
	}
	return &Redis{Client: redis.NewClient(opts), Prefix: prefix}, nil
}

// Hit increments the window's counter and lets it expire after the window ends.
func (s *Redis) Hit(ctx context.Context, key string, window time.Time) (int64, error) {
	k := s.Prefix + "ratelimit:" + key + ":" + strconv.FormatInt(window.Unix(), 10)
	pipe := s.Client.Pipeline()
	incr := pipe.Incr(ctx, k)
	pipe.ExpireNX(ctx, k, 2*time.Minute)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	return incr.Val(), nil
}
